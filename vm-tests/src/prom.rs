//! `/metrics` read by a real Prometheus parser: the official Python client
//! library's (`prometheus_client.parser`, Debian's python3-prometheus-client,
//! run with the system's `/usr/bin/python3`), not by the code that wrote it.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use serde::Deserialize;

/// One sample.
#[derive(Debug, Clone, Deserialize)]
pub struct Sample {
    /// Its name (a counter's ends in `_total`, a histogram's in
    /// `_bucket`, `_sum`, `_count`).
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value, as the parser printed it.
    value: String,
}

impl Sample {
    /// The value.
    pub fn value(&self) -> f64 {
        self.value.parse().unwrap_or(f64::NAN)
    }
}

/// One family: its type and help as declared, and its samples.
#[derive(Debug, Clone, Deserialize)]
pub struct Family {
    /// `counter`, `gauge`, `histogram`, ... (`unknown` when undeclared).
    #[serde(rename = "type")]
    pub kind: String,
    /// The `# HELP` text.
    pub help: String,
    /// Its samples.
    pub samples: Vec<Sample>,
}

const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for f in text_string_to_metric_families(sys.stdin.read()):
    if f.name in out:
        raise SystemExit("family %s declared twice" % f.name)
    out[f.name] = {"type": f.type, "help": f.documentation,
                   "samples": [{"name": s.name, "labels": s.labels, "value": repr(s.value)}
                               for s in f.samples]}
print(json.dumps(out))
"#;

/// The families of `text` by name (a counter's family name is without
/// `_total`, as the parser gives it), or the parser's error.
pub fn parse(text: &str) -> Result<BTreeMap<String, Family>, String> {
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("/usr/bin/python3: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    stdin
        .write_all(text.as_bytes())
        .map_err(|e| e.to_string())?;
    drop(stdin);
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
}

/// Whether the parser is installed (`make deps` installs it); under
/// `make test` as root it must be.
pub fn available() -> bool {
    let ok = Command::new("/usr/bin/python3")
        .args(["-c", "import prometheus_client.parser"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("XVS_REQUIRE_PRIVILEGED").is_none(),
            "python3-prometheus-client is missing (make deps installs it)"
        );
        eprintln!("skipping: python3-prometheus-client not installed");
    }
    ok
}
