//! A small SVG chart of written and committed records over time, with a
//! mark at each completed checkpoint: committed output follows written
//! output one checkpoint behind.
//!
//! Two polylines and a few lines of text; written by hand rather than with a
//! plotting crate, whose text layout would pull in system font libraries.

use std::fmt::Write;

/// One sample of a running job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Seconds since the job started.
    pub at_s: f64,
    /// Records written so far.
    pub written: u64,
    /// Records committed so far.
    pub committed: u64,
    /// Checkpoints completed so far.
    pub checkpoints: u64,
}

const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 400.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// Renders `samples` (in time order) as an SVG document titled `title`.
pub fn render(title: &str, samples: &[Sample]) -> String {
    let end_s = samples.last().map_or(1.0, |s| s.at_s).max(0.001);
    let top = samples
        .iter()
        .map(|s| s.written.max(s.committed))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let x = |at_s: f64| LEFT + at_s / end_s * (WIDTH - LEFT - RIGHT);
    let y = |count: u64| HEIGHT - BOTTOM - count as f64 / top * (HEIGHT - TOP - BOTTOM);
    let line = |pick: fn(&Sample) -> u64| {
        samples
            .iter()
            .map(|s| format!("{:.1},{:.1}", x(s.at_s), y(pick(s))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="24" font-size="15">{}</text>"#,
        escape(title)
    );
    // Axes, with the largest count and the duration as labels.
    let (x0, x1, y0, y1) = (x(0.0), x(end_s), y(0), y(top as u64));
    let _ = writeln!(
        svg,
        r#"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{y1}" text-anchor="end">{}</text>"#,
        x0 - 6.0,
        top as u64
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{y0}" text-anchor="end">0</text>"#,
        x0 - 6.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="{x1}" y="{}" text-anchor="end">{end_s:.1} s</text>"#,
        y0 + 20.0
    );
    // A mark at each completed checkpoint.
    let mut seen = 0;
    for sample in samples {
        if sample.checkpoints > seen {
            seen = sample.checkpoints;
            let at = x(sample.at_s);
            let _ = writeln!(
                svg,
                r##"<line class="checkpoint" x1="{at:.1}" y1="{y0}" x2="{at:.1}" y2="{y1}" stroke="#999" stroke-dasharray="4 4"/>"##
            );
        }
    }
    let _ = writeln!(
        svg,
        r##"<polyline class="written" fill="none" stroke="#1f77b4" stroke-width="2" points="{}"/>"##,
        line(|s| s.written)
    );
    let _ = writeln!(
        svg,
        r##"<polyline class="committed" fill="none" stroke="#2ca02c" stroke-width="2" points="{}"/>"##,
        line(|s| s.committed)
    );
    let legend_y = HEIGHT - 12.0;
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="{legend_y}" fill="#1f77b4">written</text><text x="{}" y="{legend_y}" fill="#2ca02c">committed</text><text x="{}" y="{legend_y}" fill="#999">- - - checkpoint completed</text>"##,
        LEFT + 70.0,
        LEFT + 160.0
    );
    svg.push_str("</svg>\n");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_both_series_and_a_mark_per_checkpoint() {
        let samples = [
            Sample {
                at_s: 0.0,
                written: 0,
                committed: 0,
                checkpoints: 0,
            },
            Sample {
                at_s: 1.0,
                written: 50,
                committed: 0,
                checkpoints: 0,
            },
            Sample {
                at_s: 1.1,
                written: 55,
                committed: 50,
                checkpoints: 1,
            },
            Sample {
                at_s: 2.1,
                written: 100,
                committed: 100,
                checkpoints: 2,
            },
        ];
        let svg = render("a <demo>", &samples);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("class=\"checkpoint\"").count(), 2);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("a &lt;demo&gt;"));
    }
}
