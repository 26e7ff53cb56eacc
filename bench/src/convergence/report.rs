//! What `iota-bench convergence` reports: each variant's outcome, the
//! table it prints, and the loss curves it writes (SVG, beside the JSON).

use std::path::Path;

use anyhow::{Context, Result};
use serde::Serialize;

use super::variant::{BoundarySpec, Variant};

/// One variant's result.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub name: String,
    pub final_loss: f32,
    /// (tokens trained, validation loss of the model a user would have then).
    pub curve: Vec<(u64, f32)>,
    pub seconds: f64,
    pub tokens: u64,
    pub merges: u64,
    /// A `Boundary` variant's bytes per token on the wire (one direction)
    /// and compression against the bf16 hidden state.
    pub wire_bytes_per_token: Option<usize>,
    pub compression: Option<f64>,
}

/// Writes a new file; an existing one is never overwritten.
pub(super) fn write_new(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("creating {} (never overwritten)", path.display()))?;
    f.write_all(bytes)?;
    Ok(())
}

pub(super) fn print_table(outcomes: &[Outcome]) {
    let base = outcomes.iter().find(|o| o.name == Variant::OneProcess.name()).map(|o| o.final_loss);
    let none = Variant::Boundary(BoundarySpec::NONE).name();
    let unbottlenecked = outcomes.iter().find(|o| o.name == none).map(|o| o.final_loss);
    println!(
        "\n  {:<40} {:>10} {:>12} {:>10} {:>8} {:>9} {:>8} {:>10}",
        "", "val loss", "vs one proc", "seconds", "tok/s", "B/token", "vs bf16", "vs no bn"
    );
    for o in outcomes {
        let rel = |b: Option<f32>| b.map_or("-".to_string(), |b| format!("{:+.2}%", (o.final_loss / b - 1.0) * 100.0));
        println!(
            "  {:<40} {:>10.4} {:>12} {:>10.1} {:>8.0} {:>9} {:>8} {:>10}",
            o.name,
            o.final_loss,
            rel(base),
            o.seconds,
            o.tokens as f64 / o.seconds.max(1e-9),
            o.wire_bytes_per_token.map_or("-".to_string(), |b| b.to_string()),
            o.compression.map_or("-".to_string(), |c| if c < 10.0 { format!("{c:.1}x") } else { format!("{c:.0}x") }),
            if o.wire_bytes_per_token.is_some() { rel(unbottlenecked) } else { "-".to_string() },
        );
    }
}

/// The loss curves as an SVG line chart: tokens on x, validation loss on y.
pub fn plot_svg(outcomes: &[Outcome], model: &str) -> String {
    const W: f64 = 760.0;
    const H: f64 = 440.0;
    const L: f64 = 70.0;
    const R: f64 = 250.0;
    const T: f64 = 40.0;
    const B: f64 = 50.0;
    const COLORS: [&str; 10] =
        ["#000000", "#7f7f7f", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
    let points = outcomes.iter().flat_map(|o| o.curve.iter());
    let (mut x_max, mut y_min, mut y_max) = (1.0f64, f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in points {
        x_max = x_max.max(x as f64);
        if y.is_finite() {
            y_min = y_min.min(y as f64);
            y_max = y_max.max(y as f64);
        }
    }
    if !y_min.is_finite() {
        (y_min, y_max) = (0.0, 1.0);
    }
    let pad = ((y_max - y_min) * 0.05).max(1e-3);
    let (y_lo, y_hi) = (y_min - pad, y_max + pad);
    let px = |x: f64| L + x / x_max * (W - L - R);
    let py = |y: f64| T + (y_hi - y) / (y_hi - y_lo) * (H - T - B);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{L}\" y=\"24\" font-size=\"14\">validation loss vs tokens trained ({model})</text>\n"
    );
    let (x0, x1, y0, y1) = (px(0.0), px(x_max), py(y_lo), py(y_hi));
    s += &format!("<path d=\"M{x0},{y1} L{x0},{y0} L{x1},{y0}\" stroke=\"black\" fill=\"none\"/>\n");
    for i in 0..=4 {
        let yv = y_lo + (y_hi - y_lo) * i as f64 / 4.0;
        let xv = x_max * i as f64 / 4.0;
        s += &format!("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{yv:.2}</text>\n", x0 - 6.0, py(yv) + 4.0);
        s += &format!("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{:.0}k</text>\n", px(xv), y0 + 18.0, xv / 1e3);
    }
    s += &format!("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">tokens</text>\n", (x0 + x1) / 2.0, H - 10.0);
    for (i, o) in outcomes.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<String> = o
            .curve
            .iter()
            .filter(|p| p.1.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x as f64), py(y as f64)))
            .collect();
        s += &format!("<polyline points=\"{}\" stroke=\"{c}\" stroke-width=\"1.5\" fill=\"none\"/>\n", pts.join(" "));
        let ly = T + 16.0 * i as f64;
        s += &format!(
            "<line x1=\"{}\" y1=\"{ly}\" x2=\"{}\" y2=\"{ly}\" stroke=\"{c}\" stroke-width=\"2\"/>\
             <text x=\"{}\" y=\"{}\">{} ({:.3})</text>\n",
            W - R + 15.0,
            W - R + 35.0,
            W - R + 40.0,
            ly + 4.0,
            o.name,
            o.final_loss
        );
    }
    s += "</svg>\n";
    s
}
