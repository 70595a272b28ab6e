// JDBC logins, run by tests/tests/all/e2e_auth.rs (jdbc_logins_and_grants)
// as `java -cp postgresql.jar Auth.java` with PGPORT set: pgjdbc's
// SCRAM-SHA-256, a wrong password (28P01), and a tenant kept out of another
// tenant's table (42501) until a GRANT lets it in.
import java.sql.*;
public class Auth {
  static String url(String db) {
    return "jdbc:postgresql://127.0.0.1:" + System.getenv("PGPORT") + "/" + db + "?sslmode=disable";
  }
  static String state(Connection c, String sql) {
    try (Statement s = c.createStatement(); ResultSet r = s.executeQuery(sql)) {
      r.next();
      return "rows:" + r.getString(1);
    } catch (SQLException e) {
      return e.getSQLState();
    }
  }
  public static void main(String[] a) throws Exception {
    try {
      DriverManager.getConnection(url("public"), "sandflow", "not-it").close();
      throw new RuntimeException("a wrong password logged in");
    } catch (SQLException e) {
      if (!"28P01".equals(e.getSQLState())) throw new RuntimeException("wrong password: " + e.getSQLState() + " " + e);
    }
    try (Connection root = DriverManager.getConnection(url("public"), "sandflow", System.getenv("ADMIN_PW"));
         Connection alice = DriverManager.getConnection(url("ta"), "alice", "alice-pw")) {
      String before = state(alice, "SELECT count(*) FROM tb.m");
      if (!"42501".equals(before)) throw new RuntimeException("before grant: " + before);
      try (Statement s = root.createStatement()) { s.execute("GRANT SELECT ON TABLE tb.m TO alice"); }
      String after = state(alice, "SELECT count(*) FROM tb.m");
      if (!"rows:2".equals(after)) throw new RuntimeException("after grant: " + after);
      try (Statement s = root.createStatement()) { s.execute("REVOKE SELECT ON TABLE tb.m FROM alice"); }
      String revoked = state(alice, "SELECT count(*) FROM tb.m");
      if (!"42501".equals(revoked)) throw new RuntimeException("after revoke: " + revoked);
    }
    System.out.println("ok");
  }
}
