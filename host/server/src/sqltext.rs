//! Quoting helpers for SQL text the front doors build.

/// `'text'` with quotes doubled.
pub fn quote_literal(s: &str) -> String {
    sandflow::sql::quote_literal(s)
}

/// `"ident"` with quotes doubled.
pub fn quote_ident(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' {
            out.push('"');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes() {
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
