//! Which HTTP requests come from a web page that must not use the API: a page
//! on another origin (cross-site request forgery), or a page that reached the
//! server through a DNS name it does not own (DNS rebinding).
//!
//! Browsers say where a request comes from: `Origin` on every POST and on
//! cross-origin GETs, `Sec-Fetch-Site` on every request of a current browser.
//! Clients such as curl, Python's requests or a Grafana backend send neither
//! and are not checked. A request that sends either must:
//!
//! - name the server by an allowed host in `Host`: an IP address, `localhost`,
//!   or a name given with `--http-allowed-hosts`;
//! - come from the server's own origin: `Origin`, when present, is
//!   `http://` + the `Host` (same name, same port); `Sec-Fetch-Site`, when
//!   present, is `same-origin` or `none` (typed in the address bar).

use std::net::{IpAddr, Ipv6Addr};

use snafu::Snafu;

/// Why a request was refused; the message tells the user what to do.
#[derive(Debug, Snafu, PartialEq)]
pub enum Refusal {
    #[snafu(display(
        "request refused: it comes from a web browser but names no Host; sandflow's HTTP API \
         answers browsers only on its own origin"
    ))]
    NoHost,
    #[snafu(display(
        "request refused: Host {host:?} is not a name of this server, and a web page that \
         reaches it under another name may be DNS rebinding; if browsers reach sandflow by \
         this name, start it with --http-allowed-hosts {name} (TOML [http] allowed_hosts, \
         environment SANDFLOW_HTTP_ALLOWED_HOSTS)"
    ))]
    HostNotAllowed { host: String, name: String },
    #[snafu(display(
        "cross-origin request refused: it comes from a web page on {origin} and sandflow \
         answers only requests from its own origin ({own}); call the API from a backend or \
         a command-line client (they send no Origin header)"
    ))]
    CrossOrigin { origin: String, own: String },
    #[snafu(display(
        "cross-site request refused (Sec-Fetch-Site: {site}): a web page on another site \
         may not use sandflow's HTTP API; call it from a backend or a command-line client"
    ))]
    CrossSite { site: String },
}

/// The host names browsers may use besides IP addresses and `localhost`.
#[derive(Debug, Clone, Default)]
pub struct AllowedHosts {
    names: Vec<String>,
}

impl AllowedHosts {
    /// `names` as given (compared without regard to case).
    pub fn new(names: impl IntoIterator<Item = String>) -> AllowedHosts {
        AllowedHosts {
            names: names.into_iter().map(|n| n.to_ascii_lowercase()).collect(),
        }
    }

    /// Whether `host` (a `Host` header's name, without port; `[...]` for IPv6)
    /// names this server.
    pub fn allows(&self, host: &str) -> bool {
        if host.parse::<IpAddr>().is_ok() {
            return true;
        }
        if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            return v6.parse::<Ipv6Addr>().is_ok();
        }
        host.eq_ignore_ascii_case("localhost")
            || self.names.iter().any(|n| n.eq_ignore_ascii_case(host))
    }
}

/// Splits `name[:port]` or `[v6][:port]`; the port defaults to 80. `None` when
/// it is not of that form.
fn split_authority(authority: &str) -> Option<(&str, u16)> {
    let (host, port) = if authority.starts_with('[') {
        let end = authority.find(']')?;
        let (host, rest) = authority.split_at(end + 1);
        match rest {
            "" => (host, None),
            _ => (host, Some(rest.strip_prefix(':')?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        None => 80,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p.parse().ok()?,
        Some(_) => return None,
    };
    let bad = |c: char| c.is_whitespace() || matches!(c, '/' | '?' | '#' | '@' | ':');
    let plain = !host.starts_with('[') && !host.contains(bad);
    let bracketed = host.starts_with('[') && !host.contains(char::is_whitespace);
    (!host.is_empty() && (plain || bracketed)).then_some((host, port))
}

/// Decides whether a request may go on, from its `Origin`, `Sec-Fetch-Site`
/// and `Host` headers (see the module docs).
pub fn check(
    origin: Option<&str>,
    sec_fetch_site: Option<&str>,
    host: Option<&str>,
    allowed: &AllowedHosts,
) -> Result<(), Refusal> {
    if origin.is_none() && sec_fetch_site.is_none() {
        return Ok(());
    }
    let host_header = host.map(str::trim).filter(|h| !h.is_empty());
    let Some(host_header) = host_header else {
        return Err(Refusal::NoHost);
    };
    let Some((name, port)) = split_authority(host_header) else {
        return Err(Refusal::HostNotAllowed {
            host: host_header.to_string(),
            name: host_header.to_string(),
        });
    };
    if !allowed.allows(name) {
        return Err(Refusal::HostNotAllowed {
            host: host_header.to_string(),
            name: name.to_ascii_lowercase(),
        });
    }
    if let Some(origin) = origin {
        let same = origin
            .trim()
            .strip_prefix("http://")
            .and_then(split_authority)
            .is_some_and(|(o_name, o_port)| o_name.eq_ignore_ascii_case(name) && o_port == port);
        if !same {
            return Err(Refusal::CrossOrigin {
                origin: origin.to_string(),
                own: format!("http://{host_header}"),
            });
        }
    }
    if let Some(site) = sec_fetch_site {
        let site = site.trim();
        if !(site.eq_ignore_ascii_case("same-origin") || site.eq_ignore_ascii_case("none")) {
            return Err(Refusal::CrossSite {
                site: site.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed() -> AllowedHosts {
        AllowedHosts::new(["DB.example.com".to_string()])
    }

    fn ok(origin: Option<&str>, site: Option<&str>, host: Option<&str>) -> bool {
        check(origin, site, host, &allowed()).is_ok()
    }

    #[test]
    fn clients_without_browser_headers_pass() {
        assert!(ok(None, None, None));
        assert!(ok(None, None, Some("evil.example:4000")));
        assert!(ok(None, None, Some("127.0.0.1:4000")));
    }

    #[test]
    fn same_origin_on_allowed_hosts_passes() {
        for (origin, host) in [
            ("http://127.0.0.1:4000", "127.0.0.1:4000"),
            ("http://localhost:4000", "localhost:4000"),
            ("http://LOCALHOST:4000", "localhost:4000"),
            ("http://[::1]:4000", "[::1]:4000"),
            ("http://db.example.com:4000", "db.example.com:4000"),
            ("http://db.example.com", "DB.Example.com:80"),
            ("http://10.0.0.7", "10.0.0.7"),
        ] {
            assert!(ok(Some(origin), None, Some(host)), "{origin} {host}");
            assert!(
                ok(Some(origin), Some("same-origin"), Some(host)),
                "{origin} {host}"
            );
        }
        // Typed in the address bar, or same-origin without Origin (GET).
        assert!(ok(None, Some("none"), Some("localhost:4000")));
        assert!(ok(None, Some("same-origin"), Some("127.0.0.1:4000")));
        assert!(ok(None, Some("Same-Origin"), Some("db.example.com:4000")));
    }

    #[test]
    fn other_origins_are_refused() {
        for origin in [
            "http://evil.example",
            "http://evil.example:4000",
            "https://127.0.0.1:4000",
            "http://127.0.0.1:4001",
            "http://127.0.0.1",
            "http://127.0.0.1:4000.evil.example",
            "http://127.0.0.1:4000/path",
            "http://user@127.0.0.1:4000",
            "null",
            "",
        ] {
            let e = check(Some(origin), None, Some("127.0.0.1:4000"), &allowed()).unwrap_err();
            assert!(matches!(e, Refusal::CrossOrigin { .. }), "{origin}: {e}");
            assert!(e.to_string().contains("cross-origin"), "{e}");
        }
    }

    #[test]
    fn cross_site_fetch_metadata_is_refused() {
        for site in ["cross-site", "same-site", "bogus"] {
            let e = check(None, Some(site), Some("127.0.0.1:4000"), &allowed()).unwrap_err();
            assert!(matches!(e, Refusal::CrossSite { .. }), "{site}: {e}");
        }
        // Even with a matching Origin.
        let e = check(
            Some("http://127.0.0.1:4000"),
            Some("cross-site"),
            Some("127.0.0.1:4000"),
            &allowed(),
        )
        .unwrap_err();
        assert!(matches!(e, Refusal::CrossSite { .. }), "{e}");
    }

    #[test]
    fn dns_rebinding_is_refused() {
        // The attacker's page and its requests share the attacker's name.
        for (origin, site) in [
            (Some("http://evil.example:4000"), None),
            (None, Some("same-origin")),
            (Some("http://evil.example:4000"), Some("same-origin")),
        ] {
            let e = check(origin, site, Some("evil.example:4000"), &allowed()).unwrap_err();
            assert_eq!(
                e,
                Refusal::HostNotAllowed {
                    host: "evil.example:4000".into(),
                    name: "evil.example".into()
                }
            );
            assert!(
                e.to_string().contains("--http-allowed-hosts evil.example"),
                "{e}"
            );
        }
        for host in [
            "localhost.evil.example",
            "127.0.0.1.evil.example:4000",
            "db.example.com.evil.example",
            "[not-an-ip]:4000",
            "a b:4000",
            "127.0.0.1:port",
        ] {
            assert!(!ok(None, Some("same-origin"), Some(host)), "{host}");
        }
        assert_eq!(
            check(None, Some("none"), None, &allowed()),
            Err(Refusal::NoHost)
        );
        assert_eq!(
            check(Some("http://127.0.0.1"), None, Some("  "), &allowed()),
            Err(Refusal::NoHost)
        );
    }
}
