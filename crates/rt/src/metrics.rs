//! One registry of figures, from which every rendering comes: memcache's
//! `stats` lines, the native protocol's STATS pairs, Prometheus' text
//! format (`/metrics`) and `granary stat` (text and JSON). A component
//! (the store, a protocol server) adds its figures to a [`Registry`] once,
//! each with its name, help, kind and value, and the renderers below turn
//! the same list into each format, so a figure is declared in one place.
//!
//! Names: [`Metric::name`] is the figure's own name, as `stats`, STATS and
//! `granary stat` print it (memcached's names where they exist:
//! `curr_connections`, `get_hits`); a dotted name (`recovery.millis`)
//! nests in JSON. The Prometheus name is the metric's family, which
//! several figures may share with a label each (`granary_memcache_commands_total{cmd="get"}`,
//! with the help and kind of the family's first figure). Latency
//! histograms are rendered by their owners beside these (a histogram is
//! not one value).

use std::fmt::Write as _;

/// Prometheus' metric types used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (Prometheus `counter`).
    Counter,
    /// Goes up and down (Prometheus `gauge`).
    Gauge,
    /// A fact, not a number: printed by `stats`, STATS and `granary stat`,
    /// left out of Prometheus.
    Info,
}

/// A figure's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U64(u64),
    F64(f64),
    Bool(bool),
    Text(String),
}

impl Value {
    fn number(&self) -> Option<f64> {
        match self {
            Value::U64(v) => Some(*v as f64),
            Value::F64(v) => Some(*v),
            Value::Bool(b) => Some(*b as u8 as f64),
            Value::Text(_) => None,
        }
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::U64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Text(s) => f.write_str(s),
        }
    }
}

/// One figure.
#[derive(Debug, Clone)]
pub struct Metric {
    /// Its own name (see the module doc).
    pub name: String,
    pub help: &'static str,
    pub kind: Kind,
    /// Its Prometheus family and label, when it is exported there.
    pub family: Option<(String, Option<(&'static str, String)>)>,
    pub value: Value,
}

/// Figures in the order they were added.
#[derive(Debug, Default, Clone)]
pub struct Registry {
    metrics: Vec<Metric>,
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Add a figure that is not exported to Prometheus.
    pub fn add(&mut self, name: impl Into<String>, help: &'static str, kind: Kind, value: Value) -> &mut Self {
        self.metrics.push(Metric { name: name.into(), help, kind, family: None, value });
        self
    }

    /// Add a figure exported to Prometheus as `family` (with `label` =
    /// (label name, label value), if any).
    pub fn export(
        &mut self,
        name: impl Into<String>,
        help: &'static str,
        kind: Kind,
        family: impl Into<String>,
        label: Option<(&'static str, &str)>,
        value: Value,
    ) -> &mut Self {
        let family = Some((family.into(), label.map(|(k, v)| (k, v.to_string()))));
        self.metrics.push(Metric { name: name.into(), help, kind, family, value });
        self
    }

    /// A counter exported as its own family (`family` without a label).
    pub fn counter(&mut self, name: &str, family: impl Into<String>, help: &'static str, v: u64) -> &mut Self {
        self.export(name, help, Kind::Counter, family, None, Value::U64(v))
    }

    /// A gauge exported as its own family.
    pub fn gauge(
        &mut self,
        name: &str,
        family: impl Into<String>,
        help: &'static str,
        v: impl Into<Value>,
    ) -> &mut Self {
        self.export(name, help, Kind::Gauge, family, None, v.into())
    }

    /// A fact for `stats` and `granary stat` (not exported).
    pub fn info(&mut self, name: &str, help: &'static str, v: impl Into<Value>) -> &mut Self {
        self.add(name, help, Kind::Info, v.into())
    }

    /// Every figure, in order.
    pub fn metrics(&self) -> &[Metric] {
        &self.metrics
    }

    /// The figure named `name`.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.metrics.iter().find(|m| m.name == name).map(|m| &m.value)
    }

    /// Memcache `stats` lines: `STAT name value\r\n` for each figure.
    pub fn render_stats(&self, out: &mut String) {
        for m in &self.metrics {
            let _ = write!(out, "STAT {} {}\r\n", m.name, m.value);
        }
    }

    /// Whether every dotted prefix's figures are next to each other (what
    /// [`Registry::render_json`] needs).
    pub fn prefixes_together(&self) -> bool {
        let mut closed = std::collections::HashSet::new();
        let mut open: Vec<&str> = Vec::new();
        for m in &self.metrics {
            let parts: Vec<&str> = m.name.split('.').collect();
            let path = &parts[..parts.len() - 1];
            let common = open.iter().zip(path).take_while(|(a, b)| a == b).count();
            while open.len() > common {
                closed.insert(open.join("."));
                open.pop();
            }
            for p in &path[common..] {
                open.push(p);
                if closed.contains(&open.join(".")) {
                    return false;
                }
            }
        }
        true
    }

    /// (name, value) pairs, as the native protocol's STATS answers them.
    pub fn pairs(&self) -> Vec<(String, String)> {
        self.metrics.iter().map(|m| (m.name.clone(), m.value.to_string())).collect()
    }

    /// Prometheus' text format: HELP and TYPE once per family (families in
    /// the order of their first figure), then its samples. Info figures
    /// and figures without a family are left out.
    pub fn render_prometheus(&self, out: &mut String) {
        let exported = |m: &&Metric| m.kind != Kind::Info && m.family.is_some() && m.value.number().is_some();
        let mut families: Vec<&str> = Vec::new();
        for m in self.metrics.iter().filter(exported) {
            let (family, _) = m.family.as_ref().expect("filtered");
            if !families.contains(&family.as_str()) {
                families.push(family);
            }
        }
        for family in families {
            let mut samples =
                self.metrics.iter().filter(exported).filter(|m| m.family.as_ref().is_some_and(|f| f.0 == family));
            let first = samples.next().expect("a family has a figure");
            let kind = if first.kind == Kind::Counter { "counter" } else { "gauge" };
            let _ = writeln!(out, "# HELP {family} {}", first.help);
            let _ = writeln!(out, "# TYPE {family} {kind}");
            for m in std::iter::once(first).chain(samples) {
                let v = m.value.number().expect("filtered");
                match &m.family.as_ref().expect("filtered").1 {
                    Some((k, lv)) => {
                        let _ = writeln!(out, "{family}{{{k}=\"{lv}\"}} {v}");
                    }
                    None => {
                        let _ = writeln!(out, "{family} {v}");
                    }
                }
            }
        }
    }

    /// `name value` lines, names padded to one column.
    pub fn render_text(&self) -> String {
        let width = self.metrics.iter().map(|m| m.name.len()).max().unwrap_or(0);
        let mut out = String::new();
        for m in &self.metrics {
            let _ = writeln!(out, "{:width$}  {}", m.name, m.value);
        }
        out
    }

    /// One JSON object; a dotted name nests (`recovery.millis` is
    /// `{"recovery": {"millis": ...}}`). Figures of one prefix must be
    /// added next to each other ([`Registry::prefixes_together`]: a prefix
    /// met again would be a second object of its name, which JSON readers
    /// take for the first's replacement).
    pub fn render_json(&self) -> String {
        debug_assert!(self.prefixes_together(), "a dotted prefix's figures are apart");
        let mut out = String::from("{");
        let mut open: Vec<&str> = Vec::new();
        let mut first = true;
        for m in &self.metrics {
            let parts: Vec<&str> = m.name.split('.').collect();
            let (path, leaf) = parts.split_at(parts.len() - 1);
            let common = open.iter().zip(path).take_while(|(a, b)| a == b).count();
            while open.len() > common {
                open.pop();
                out.push('}');
                first = false;
            }
            for p in &path[common..] {
                if !first {
                    out.push(',');
                }
                let _ = write!(out, "{}:{{", json_string(p));
                open.push(p);
                first = true;
            }
            if !first {
                out.push(',');
            }
            let v = match &m.value {
                Value::U64(v) => v.to_string(),
                Value::F64(v) if v.is_finite() => v.to_string(),
                Value::F64(_) => "null".into(),
                Value::Bool(b) => b.to_string(),
                Value::Text(s) => json_string(s),
            };
            let _ = write!(out, "{}:{v}", json_string(leaf[0]));
            first = false;
        }
        for _ in open {
            out.push('}');
        }
        out.push('}');
        out
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::U64(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::F64(v)
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prefix met again after another is apart; nested prefixes and a
    /// prefix's figures together are not.
    #[test]
    fn prefixes_apart_are_found() {
        let mut r = Registry::new();
        r.counter("a.x", "a_x", ".", 1).counter("a.b.y", "a_b_y", ".", 1).counter("a.z", "a_z", ".", 1);
        r.counter("c", "c", ".", 1);
        assert!(r.prefixes_together());
        r.counter("a.w", "a_w", ".", 1);
        assert!(!r.prefixes_together());
        let mut r = Registry::new();
        r.counter("a.b.x", "a_b_x", ".", 1).counter("a.c", "a_c", ".", 1).counter("a.b.y", "a_b_y", ".", 1);
        assert!(!r.prefixes_together());
    }

    fn sample() -> Registry {
        let mut r = Registry::new();
        r.info("device", "The device.", "file x.db")
            .counter("gets", "granary_store_gets_total", "GETs.", 7)
            .export(
                "cmd_get",
                "Commands by kind.",
                Kind::Counter,
                "granary_commands_total",
                Some(("cmd", "get")),
                3.into(),
            )
            .export(
                "cmd_set",
                "Commands by kind.",
                Kind::Counter,
                "granary_commands_total",
                Some(("cmd", "set")),
                4.into(),
            )
            .gauge("recovery.millis", "granary_recovery_millis", "Recovery time.", 12u64)
            .info("recovery.clean", "Clean shutdown.", true)
            .gauge("occupancy", "granary_occupancy", "Entries per slot.", 0.5);
        r
    }

    #[test]
    fn every_rendering_comes_from_the_same_figures() {
        let r = sample();
        let mut stats = String::new();
        r.render_stats(&mut stats);
        assert_eq!(
            stats,
            "STAT device file x.db\r\nSTAT gets 7\r\nSTAT cmd_get 3\r\nSTAT cmd_set 4\r\nSTAT recovery.millis 12\r\n\
             STAT recovery.clean true\r\nSTAT occupancy 0.5\r\n"
        );
        let mut prom = String::new();
        r.render_prometheus(&mut prom);
        assert_eq!(
            prom,
            "# HELP granary_store_gets_total GETs.\n# TYPE granary_store_gets_total counter\ngranary_store_gets_total 7\n\
             # HELP granary_commands_total Commands by kind.\n# TYPE granary_commands_total counter\n\
             granary_commands_total{cmd=\"get\"} 3\ngranary_commands_total{cmd=\"set\"} 4\n\
             # HELP granary_recovery_millis Recovery time.\n# TYPE granary_recovery_millis gauge\ngranary_recovery_millis 12\n\
             # HELP granary_occupancy Entries per slot.\n# TYPE granary_occupancy gauge\ngranary_occupancy 0.5\n"
        );
        assert_eq!(
            r.render_json(),
            r#"{"device":"file x.db","gets":7,"cmd_get":3,"cmd_set":4,"recovery":{"millis":12,"clean":true},"occupancy":0.5}"#
        );
        let text = r.render_text();
        assert!(text.starts_with("device           file x.db\n"), "{text}");
        assert_eq!(r.pairs()[1], ("gets".to_string(), "7".to_string()));
        assert_eq!(r.get("recovery.clean"), Some(&Value::Bool(true)));
    }

    #[test]
    fn a_family_added_in_two_places_is_rendered_once() {
        let mut r = Registry::new();
        r.export("a", "Ops.", Kind::Counter, "ops_total", Some(("op", "a")), 1.into())
            .gauge("g", "g", "G.", 2u64)
            .export("b", "Ops.", Kind::Counter, "ops_total", Some(("op", "b")), 3.into());
        let mut prom = String::new();
        r.render_prometheus(&mut prom);
        assert_eq!(prom.matches("# TYPE ops_total counter").count(), 1, "{prom}");
        assert!(prom.contains("ops_total{op=\"a\"} 1\nops_total{op=\"b\"} 3\n"), "{prom}");
    }

    #[test]
    fn json_escapes_and_closes_nested_objects() {
        let mut r = Registry::new();
        r.info("a.b.c", "x", "q\"\\\n").info("a.d", "x", 1u64).info("e", "x", f64::NAN);
        assert_eq!(r.render_json(), r#"{"a":{"b":{"c":"q\"\\\u000a"},"d":1},"e":null}"#);
    }
}
