//! The end-to-end bench's results: the table on stdout, the JSON file, the
//! SVG chart (pps against number of services, one line per mode and
//! workload), and the targets with how far each is from being met.

use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

/// One measurement of one mode at one service count.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// `raw`, `xvs`, `iptables-legacy`, `iptables-nft` or `nftables`.
    pub mode: String,
    /// Services loaded (0 for the raw forwarder).
    pub services: usize,
    /// `new` or `established`.
    pub workload: String,
    /// Offered by the generator.
    pub sent_pps: f64,
    /// Delivered to the sink (`None` when the rule set did not load).
    pub pps: Option<f64>,
    /// `pps` over the raw forwarder's for the same workload.
    pub of_ceiling: Option<f64>,
    /// `pps` over iptables-legacy's at the same count and workload.
    pub of_iptables_legacy: Option<f64>,
    /// Seconds to load the rule set or service set.
    pub load_seconds: Option<f64>,
    /// Why there is no figure.
    pub error: Option<String>,
    /// What the forwarder itself counted during the run (xvs: frames
    /// received and forwarded, drops by reason).
    pub note: Option<String>,
}

/// The time one mode took to apply one endpoint change.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    /// Mode.
    pub mode: String,
    /// Services configured.
    pub services: usize,
    /// Seconds (until every xvs worker applied it; until the tool exited).
    pub seconds: Option<f64>,
    /// Why there is no figure.
    pub error: Option<String>,
}

/// A target and where it stands.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    /// What is aimed at.
    pub goal: String,
    /// What was measured.
    pub measured: String,
    /// Met or not.
    pub met: bool,
    /// By how much it is missed (empty when met).
    pub missed_by: String,
    /// The cause of a miss.
    pub cause: String,
}

/// Everything one run produced.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Seconds per measurement.
    pub seconds_per_run: f64,
    /// Measurements.
    pub rows: Vec<Row>,
    /// Endpoint changes.
    pub changes: Vec<Change>,
    /// Targets.
    pub targets: Vec<Target>,
}

/// The rounds of the same rows (same modes, counts and workloads in the
/// same order) as one: pps the median of the rounds', and each row's
/// ratio to the ceiling the median of its rounds' ratios, each against
/// the raw forwarder of its own round (a window's drift moves both);
/// the note keeps the first round's counters and adds every round's
/// ratio. `None` when the rounds' rows do not line up.
pub fn merge_rounds(mut rounds: Vec<Vec<Row>>) -> Option<Vec<Row>> {
    let first = rounds.first()?;
    let lined_up = rounds.iter().all(|r| {
        r.len() == first.len()
            && r.iter().zip(first).all(|(a, b)| {
                (&a.mode, a.services, &a.workload) == (&b.mode, b.services, &b.workload)
            })
    });
    if !lined_up {
        return None;
    }
    for r in &mut rounds {
        fill_ratios(r);
    }
    let median = |mut v: Vec<f64>| -> Option<f64> {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        match n {
            0 => None,
            _ if n % 2 == 1 => Some(v[n / 2]),
            _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
        }
    };
    let n = rounds.len();
    let merged = (0..rounds[0].len())
        .map(|i| {
            let of = |f: &dyn Fn(&Row) -> Option<f64>| -> Vec<f64> {
                rounds.iter().filter_map(|r| f(&r[i])).collect()
            };
            let mut row = rounds[0][i].clone();
            row.pps = median(of(&|r| r.pps));
            row.sent_pps = median(of(&|r| Some(r.sent_pps))).unwrap_or(0.0);
            let ratios = of(&|r| r.of_ceiling);
            row.of_ceiling = median(ratios.clone());
            if n > 1 && row.mode != "raw" {
                let each: Vec<String> = ratios.iter().map(|c| format!("{c:.2}")).collect();
                let note = format!("of ceiling by round: {}", each.join(" "));
                row.note = Some(match row.note.take() {
                    Some(s) => format!("{s} {note}"),
                    None => note,
                });
            }
            row.error = row.pps.is_none().then(|| row.error.take()).flatten();
            row
        })
        .collect();
    Some(merged)
}

/// Fills `of_ceiling` (where a round merge has not already) and
/// `of_iptables_legacy` from the rows themselves.
pub fn fill_ratios(rows: &mut [Row]) {
    let find = |rows: &[Row], mode: &str, services: Option<usize>, workload: &str| {
        rows.iter()
            .find(|r| {
                r.mode == mode && r.workload == workload && services.is_none_or(|s| r.services == s)
            })
            .and_then(|r| r.pps)
    };
    let snapshot = rows.to_vec();
    for r in rows.iter_mut() {
        let Some(pps) = r.pps else { continue };
        let ratio = |base: Option<f64>| base.filter(|b| *b > 0.0).map(|b| pps / b);
        if r.of_ceiling.is_none() {
            r.of_ceiling = ratio(find(&snapshot, "raw", None, &r.workload));
        }
        // IPv6 rows against ip6tables-legacy, IPv4 ones against
        // iptables-legacy.
        let legacy = if r.mode.ends_with("-ipv6") || r.mode.starts_with("ip6") {
            "ip6tables-legacy"
        } else {
            "iptables-legacy"
        };
        r.of_iptables_legacy = ratio(find(&snapshot, legacy, Some(r.services), &r.workload));
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

/// The table, as printed.
pub fn table(report: &Report) -> String {
    let mut out = format!(
        "{:<16} {:>8} {:<11} {:>12} {:>12} {:>9} {:>10} {:>9}\n",
        "mode", "services", "workload", "offered pps", "pps", "of ceil", "of ipt-leg", "load s"
    );
    for r in &report.rows {
        out.push_str(&format!(
            "{:<16} {:>8} {:<11} {:>12.0} {:>12} {:>9} {:>10} {:>9}{}\n",
            r.mode,
            if r.mode == "raw" {
                "-".to_owned()
            } else {
                r.services.to_string()
            },
            r.workload,
            r.sent_pps,
            opt(r.pps, 0),
            opt(r.of_ceiling, 2),
            opt(r.of_iptables_legacy, 2),
            opt(r.load_seconds, 3),
            r.error
                .as_ref()
                .map(|e| format!("  ({e})"))
                .unwrap_or_default()
        ));
    }
    let notes: Vec<&Row> = report.rows.iter().filter(|r| r.note.is_some()).collect();
    if !notes.is_empty() {
        out.push_str("\ncounted by the forwarder during each run:\n");
        for r in notes {
            out.push_str(&format!(
                "{:<16} {:>8} {:<11} {}\n",
                r.mode,
                r.services,
                r.workload,
                r.note.as_deref().unwrap_or_default()
            ));
        }
    }
    if !report.changes.is_empty() {
        out.push_str("\none endpoint change:\n");
        for c in &report.changes {
            out.push_str(&format!(
                "{:<16} {:>8} services  {:>10} ms{}\n",
                c.mode,
                c.services,
                opt(c.seconds.map(|s| s * 1e3), 3),
                c.error
                    .as_ref()
                    .map(|e| format!("  ({e})"))
                    .unwrap_or_default()
            ));
        }
    }
    if !report.targets.is_empty() {
        out.push_str("\ntargets:\n");
        for t in &report.targets {
            out.push_str(&format!(
                "[{}] {}: {}{}\n",
                if t.met { "met" } else { "MISSED" },
                t.goal,
                t.measured,
                if t.met {
                    String::new()
                } else {
                    format!(" — missed by {}; cause: {}", t.missed_by, t.cause)
                }
            ));
        }
    }
    out
}

/// Writes the JSON file.
pub fn write_json(report: &Report, path: &Path) -> Result<(), String> {
    let text = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

const MODES: [(&str, RGBColor); 7] = [
    ("xvs", RGBColor(0x1f, 0x77, 0xb4)),
    ("xvs-route", RGBColor(0x17, 0xbe, 0xcf)),
    ("xvs-gue", RGBColor(0x94, 0x67, 0xbd)),
    ("raw", RGBColor(0x7f, 0x7f, 0x7f)),
    ("iptables-legacy", RGBColor(0xd6, 0x27, 0x28)),
    ("iptables-nft", RGBColor(0xff, 0x7f, 0x0e)),
    ("nftables", RGBColor(0x2c, 0xa0, 0x2c)),
];

/// Writes the SVG chart: one panel per workload, delivered pps against
/// the number of services (log scale), one line per mode; the raw
/// forwarder, which has no services, is drawn flat as the ceiling.
pub fn write_chart(report: &Report, path: &Path) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let counts: Vec<usize> = {
        let mut c: Vec<usize> = report
            .rows
            .iter()
            .filter(|r| r.mode != "raw")
            .map(|r| r.services)
            .collect();
        c.sort_unstable();
        c.dedup();
        c
    };
    let (lo, hi) = (
        counts.first().copied().unwrap_or(1).max(1) as f64,
        counts.last().copied().unwrap_or(10).max(10) as f64,
    );
    let top = report
        .rows
        .iter()
        .filter_map(|r| r.pps)
        .fold(1.0f64, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (1100, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let panels = root.split_evenly((1, 2));
    for (panel, workload) in panels.iter().zip(["new", "established"]) {
        let title = match workload {
            "new" => "new flows (every packet a new UDP flow)",
            _ => "established flows (256 UDP flows)",
        };
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((lo..hi * 1.5).log_scale(), 0f64..top)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("services")
            .y_desc("delivered packets/s")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{:.0}k", v / 1e3))
            .draw()
            .map_err(|e| err(&e))?;
        for (mode, color) in MODES {
            let mut points: Vec<(f64, f64)> = report
                .rows
                .iter()
                .filter(|r| r.mode == mode && r.workload == workload)
                .filter_map(|r| r.pps.map(|p| (r.services.max(1) as f64, p)))
                .collect();
            if mode == "raw" {
                let Some(&(_, p)) = points.first() else {
                    continue;
                };
                points = vec![(lo, p), (hi * 1.5, p)];
            }
            if points.is_empty() {
                continue;
            }
            let style = ShapeStyle::from(color).stroke_width(2);
            chart
                .draw_series(LineSeries::new(points.clone(), style))
                .map_err(|e| err(&e))?
                .label(if mode == "raw" {
                    "raw AF_XDP (ceiling)"
                } else {
                    mode
                })
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
            if mode != "raw" {
                chart
                    .draw_series(
                        points
                            .iter()
                            .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
                    )
                    .map_err(|e| err(&e))?;
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mode: &str, services: usize, workload: &str, pps: Option<f64>) -> Row {
        Row {
            mode: mode.into(),
            services,
            workload: workload.into(),
            sent_pps: 1000.0,
            pps,
            of_ceiling: None,
            of_iptables_legacy: None,
            load_seconds: Some(0.5),
            error: pps.is_none().then(|| "did not load".into()),
            note: None,
        }
    }

    fn report() -> Report {
        let mut rows = vec![
            row("raw", 0, "new", Some(200.0)),
            row("xvs", 1, "new", Some(180.0)),
            row("xvs", 100, "new", Some(170.0)),
            row("iptables-legacy", 1, "new", Some(90.0)),
            row("iptables-legacy", 100, "new", None),
        ];
        fill_ratios(&mut rows);
        Report {
            seconds_per_run: 1.0,
            rows,
            changes: vec![],
            targets: vec![],
        }
    }

    #[test]
    fn ratios_are_against_the_ceiling_and_legacy_at_the_same_count() {
        let r = report();
        let xvs1 = &r.rows[1];
        assert_eq!(xvs1.of_ceiling, Some(0.9));
        assert_eq!(xvs1.of_iptables_legacy, Some(2.0));
        assert_eq!(r.rows[2].of_iptables_legacy, None, "legacy did not load");
        let t = table(&r);
        assert!(t.contains("did not load"), "{t}");
        assert!(t.lines().nth(2).unwrap().contains("0.90"), "{t}");
    }

    /// Three rounds: each xvs row's share is the median of its rounds'
    /// shares against their own round's ceiling (not the ratio of the
    /// medians), pps the median; rounds that do not line up are refused.
    #[test]
    fn rounds_merge_into_medians_of_same_round_ratios() {
        let round = |raw: f64, xvs: f64| {
            vec![
                row("raw", 0, "new", Some(raw)),
                row("xvs", 1, "new", Some(xvs)),
            ]
        };
        let merged = merge_rounds(vec![
            round(100.0, 90.0),
            round(200.0, 100.0),
            round(150.0, 140.0),
        ])
        .unwrap();
        assert_eq!(merged[0].pps, Some(150.0));
        assert_eq!(merged[1].pps, Some(100.0));
        // Shares 0.9, 0.5, 0.933: the median is 0.9 (100 / 150 would be 0.67).
        assert_eq!(merged[1].of_ceiling, Some(0.9));
        let note = merged[1].note.as_deref().unwrap();
        assert!(note.contains("0.90 0.50 0.93"), "{note}");
        // fill_ratios keeps a merged share.
        let mut again = merged.clone();
        fill_ratios(&mut again);
        assert_eq!(again[1].of_ceiling, Some(0.9));
        let mut odd = round(100.0, 90.0);
        odd[1].services = 100;
        assert!(merge_rounds(vec![round(100.0, 90.0), odd]).is_none());
        // One round is the round itself.
        let one = merge_rounds(vec![round(100.0, 90.0)]).unwrap();
        assert_eq!((one[1].pps, one[1].of_ceiling), (Some(90.0), Some(0.9)));
        assert!(one[1].note.is_none());
    }

    #[test]
    fn the_chart_is_an_svg_with_a_line_per_mode() {
        let dir = std::env::temp_dir().join(format!("xvs-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chart.svg");
        write_chart(&report(), &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(svg.starts_with("<svg"));
        for label in ["xvs", "iptables-legacy", "raw AF_XDP (ceiling)"] {
            assert!(svg.contains(label), "{label}");
        }
        assert!(svg.contains("<polyline"), "lines drawn");
    }
}
