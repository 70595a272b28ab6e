//! A small Prometheus registry: counters, gauges and callback gauges, rendered
//! in the text exposition format by `GET /metrics`.
//!
//! Each database has its own registry ([`crate::Database::metrics`]): two
//! databases in one process share no series. An embedder can add its own:
//!
//! ```
//! use sandflow::metrics::Registry;
//! let registry = Registry::new();
//! let ticks = registry.counter("sandflow_flow_ticks_total", "Flow ticks run.", &[("flow", "f1")]);
//! ticks.inc();
//! registry.gauge_fn("sandflow_flows", "Flows running.", &[], || 3.0);
//! assert!(registry.render().contains("sandflow_flow_ticks_total{flow=\"f1\"} 1"));
//! ```
//!
//! Asking twice for the same name and labels returns the same series, so
//! callers may either keep the handle or look it up again.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sandflow_flows::Clock;

type Labels = Vec<(String, String)>;
type GaugeFn = Arc<dyn Fn() -> f64 + Send + Sync>;

/// A monotonically increasing counter.
#[derive(Clone, Debug, Default)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down (stored as f64 bits).
#[derive(Clone, Debug, Default)]
pub struct Gauge(Arc<AtomicU64>);

impl Gauge {
    pub fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
    pub fn add(&self, d: f64) {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            let next = (f64::from_bits(cur) + d).to_bits();
            match self
                .0
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }
    pub fn inc(&self) {
        self.add(1.0);
    }
    pub fn dec(&self) {
        self.add(-1.0);
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Counter,
    Gauge,
}

enum Series {
    Counter(Counter),
    Gauge(Gauge),
    GaugeFn(GaugeFn),
}

struct Family {
    help: String,
    kind: Kind,
    series: BTreeMap<Labels, Series>,
}

/// A set of metric families. Use [`global`] unless you need an isolated one.
pub struct Registry {
    families: Mutex<BTreeMap<String, Family>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    pub fn new() -> Registry {
        Registry {
            families: Mutex::new(BTreeMap::new()),
        }
    }

    fn with_family<R>(
        &self,
        name: &str,
        help: &str,
        kind: Kind,
        f: impl FnOnce(&mut Family) -> R,
    ) -> R {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        let family = families.entry(name.to_string()).or_insert_with(|| Family {
            help: help.to_string(),
            kind,
            series: BTreeMap::new(),
        });
        f(family)
    }

    /// The counter `name{labels}`, created at 0 on first use.
    pub fn counter(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Counter {
        let labels = own(labels);
        self.with_family(name, help, Kind::Counter, |fam| {
            match fam
                .series
                .entry(labels)
                .or_insert_with(|| Series::Counter(Counter::default()))
            {
                Series::Counter(c) => c.clone(),
                // A name registered with another type: hand out a detached
                // counter rather than panicking; it is simply not exported.
                _ => Counter::default(),
            }
        })
    }

    /// The gauge `name{labels}`, created at 0 on first use.
    pub fn gauge(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Gauge {
        let labels = own(labels);
        self.with_family(name, help, Kind::Gauge, |fam| {
            match fam
                .series
                .entry(labels)
                .or_insert_with(|| Series::Gauge(Gauge::default()))
            {
                Series::Gauge(g) => g.clone(),
                _ => Gauge::default(),
            }
        })
    }

    /// A gauge whose value is computed by `f` at every scrape (replaces an
    /// earlier callback with the same name and labels).
    pub fn gauge_fn(
        &self,
        name: &str,
        help: &str,
        labels: &[(&str, &str)],
        f: impl Fn() -> f64 + Send + Sync + 'static,
    ) {
        let labels = own(labels);
        self.with_family(name, help, Kind::Gauge, |fam| {
            fam.series.insert(labels, Series::GaugeFn(Arc::new(f)));
        });
    }

    /// Removes every series of `name` with exactly these labels (e.g. when a
    /// flow is dropped).
    pub fn remove(&self, name: &str, labels: &[(&str, &str)]) {
        let labels = own(labels);
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(fam) = families.get_mut(name) {
            fam.series.remove(&labels);
        }
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        // Collect callbacks outside the lock: a callback may itself touch the
        // registry.
        let snapshot: Vec<FamilySnapshot> = {
            let families = self.families.lock().unwrap_or_else(|e| e.into_inner());
            families
                .iter()
                .map(|(name, fam)| {
                    let series = fam
                        .series
                        .iter()
                        .map(|(labels, s)| {
                            let v = match s {
                                Series::Counter(c) => SeriesValue::Int(c.get()),
                                Series::Gauge(g) => SeriesValue::Float(g.get()),
                                Series::GaugeFn(f) => SeriesValue::Fn(f.clone()),
                            };
                            (labels.clone(), v)
                        })
                        .collect();
                    (name.clone(), fam.help.clone(), fam.kind, series)
                })
                .collect()
        };
        let mut out = String::new();
        for (name, help, kind, series) in snapshot {
            if series.is_empty() {
                continue;
            }
            let _ = writeln!(out, "# HELP {name} {}", escape_help(&help));
            let kind = match kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
            };
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, value) in series {
                out.push_str(&name);
                if !labels.is_empty() {
                    out.push('{');
                    for (i, (k, v)) in labels.iter().enumerate() {
                        if i > 0 {
                            out.push(',');
                        }
                        let _ = write!(out, "{k}=\"{}\"", escape_label(v));
                    }
                    out.push('}');
                }
                let v = match value {
                    SeriesValue::Int(n) => n.to_string(),
                    SeriesValue::Float(f) => fmt_float(f),
                    SeriesValue::Fn(f) => fmt_float(f()),
                };
                let _ = writeln!(out, " {v}");
            }
        }
        out
    }
}

type FamilySnapshot = (String, String, Kind, Vec<(Labels, SeriesValue)>);

enum SeriesValue {
    Int(u64),
    Float(f64),
    Fn(GaugeFn),
}

fn own(labels: &[(&str, &str)]) -> Labels {
    let mut l: Labels = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.sort();
    l
}

fn fmt_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f.is_infinite() {
        if f > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{f}")
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

impl Registry {
    /// A database's registry, with `sandflow_uptime_seconds` and
    /// `sandflow_start_time_seconds` (on the database's clock) already in it.
    pub fn for_database(clock: Arc<dyn Clock>) -> Registry {
        let r = Registry::new();
        let started = clock.now_ms();
        r.gauge_fn(
            "sandflow_uptime_seconds",
            "Seconds since the database opened.",
            &[],
            move || (clock.now_ms() - started).max(0) as f64 / 1000.0,
        );
        r.gauge(
            "sandflow_start_time_seconds",
            "Unix time at which the database opened.",
            &[],
        )
        .set(started as f64 / 1000.0);
        r
    }
}

/// The per-front-door series (`frontdoor` = "postgres" or "http").
#[derive(Clone)]
pub struct FrontDoor {
    pub requests: Counter,
    pub errors: Counter,
    pub connections: Gauge,
}

impl FrontDoor {
    pub fn new(g: &Registry, frontdoor: &str) -> FrontDoor {
        let l = [("frontdoor", frontdoor)];
        FrontDoor {
            requests: g.counter(
                "sandflow_requests_total",
                "Requests (statements over PostgreSQL, HTTP requests) received per front door.",
                &l,
            ),
            errors: g.counter(
                "sandflow_request_errors_total",
                "Requests that ended in an error, per front door.",
                &l,
            ),
            connections: g.gauge(
                "sandflow_open_connections",
                "Client connections currently open, per front door.",
                &l,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_and_callbacks() {
        let r = Registry::new();
        let c = r.counter("x_total", "An x.", &[("b", "2"), ("a", "1\"q")]);
        c.inc();
        c.add(2);
        r.counter("x_total", "An x.", &[("a", "1\"q"), ("b", "2")])
            .inc();
        r.gauge("g", "A g.", &[]).set(1.5);
        r.gauge_fn("h", "An h.", &[("k", "v")], || 7.0);
        let text = r.render();
        assert!(text.contains("# TYPE x_total counter\n"), "{text}");
        assert!(text.contains("x_total{a=\"1\\\"q\",b=\"2\"} 4\n"), "{text}");
        assert!(text.contains("g 1.5\n"), "{text}");
        assert!(text.contains("h{k=\"v\"} 7\n"), "{text}");
    }

    #[test]
    fn type_clash_does_not_panic() {
        let r = Registry::new();
        r.counter("same", "c", &[]).inc();
        r.gauge("same", "g", &[]).set(3.0);
        assert!(r.render().contains("same 1\n"));
    }
}
