// JDBC end-to-end check, run by tests/tests/e2e_extended.rs (jdbc test) as
// `java -cp postgresql.jar Main.java` with PGPORT set.
import java.sql.*;
public class Main {
  public static void main(String[] a) throws Exception {
    String url = "jdbc:postgresql://127.0.0.1:" + System.getenv("PGPORT") + "/public?sslmode=disable";
    try (Connection c = DriverManager.getConnection(url, "sandflow", "")) {
      try (Statement s = c.createStatement()) {
        s.execute("CREATE TABLE j (k STRING, v DOUBLE, n BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))");
      }
      try (PreparedStatement p = c.prepareStatement("INSERT INTO j (k, v, n, ts) VALUES (?, ?, ?, ?)")) {
        for (int i = 0; i < 3; i++) {
          p.setString(1, "k" + i); p.setDouble(2, i + 0.5); p.setLong(3, i);
          p.setTimestamp(4, Timestamp.valueOf("2024-01-01 00:00:0" + i));
          int n = p.executeUpdate();
          if (n != 1) throw new RuntimeException("insert count " + n);
        }
      }
      try (PreparedStatement p = c.prepareStatement("SELECT k, v, n, ts FROM j WHERE v > ? ORDER BY k")) {
        p.setDouble(1, 1.0);
        try (ResultSet r = p.executeQuery()) {
          StringBuilder sb = new StringBuilder();
          while (r.next()) sb.append(r.getString(1)).append('|').append(r.getDouble(2)).append('|').append(r.getLong(3)).append('|').append(r.getTimestamp(4)).append('\n');
          if (!sb.toString().equals("k1|1.5|1|2024-01-01 00:00:01.0\nk2|2.5|2|2024-01-01 00:00:02.0\n")) throw new RuntimeException("select: " + sb);
        }
      }
      try (Statement s = c.createStatement(); ResultSet r = s.executeQuery("SHOW TABLES")) {
        boolean found = false; while (r.next()) if (r.getString(1).equals("j")) found = true;
        if (!found) throw new RuntimeException("SHOW TABLES lacks j");
      }
      try (Statement s = c.createStatement(); ResultSet r = s.executeQuery("DESC TABLE j")) {
        int n = 0; while (r.next()) n++;
        if (n != 4) throw new RuntimeException("DESC rows " + n);
      }
      try (Statement s = c.createStatement()) {
        s.executeQuery("SELECT * FROM nope");
        throw new RuntimeException("expected error");
      } catch (SQLException e) {
        if (!"42P01".equals(e.getSQLState())) throw new RuntimeException("sqlstate " + e.getSQLState() + " " + e);
      }
      try (PreparedStatement p = c.prepareStatement("DELETE FROM j WHERE k = ?")) {
        p.setString(1, "k0");
        int n = p.executeUpdate();
        if (n != 1) throw new RuntimeException("delete count " + n);
      }
      DatabaseMetaData md = c.getMetaData();
      try (ResultSet r = md.getTables(null, null, "%", new String[]{"TABLE"})) {
        boolean found = false; while (r.next()) if (r.getString("TABLE_NAME").equals("j")) found = true;
        if (!found) throw new RuntimeException("metadata lacks j");
      }
      try (Statement s = c.createStatement(); ResultSet r = s.executeQuery("SELECT count(*) FROM j")) {
        r.next(); if (r.getLong(1) != 2) throw new RuntimeException("count " + r.getLong(1));
      }
    }
    System.out.println("ok");
  }
}
