//! A standalone SVG of a sweep: one panel per figure (delivered MB/s, p99 end-to-end latency, the
//! broker's CPU per delivered GB, log bytes read), two to a row, against the swept value on a
//! log-2 axis, one line per series (coalescing on/off, raw baseline), with axes, ticks, labels and
//! a legend. Hand-written: no dependencies, opens in any browser.

use std::fmt::Write;

/// One line of a panel.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    /// (x, y) points; points with a non-finite or (on a log axis) non-positive y are left out.
    pub points: Vec<(f64, f64)>,
    /// SVG `stroke-dasharray` (None: solid).
    pub dash: Option<&'static str>,
}

#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub series: Vec<Series>,
    /// Logarithmic y axis (latencies spanning decades).
    pub log_y: bool,
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];
const PANEL_W: f64 = 520.0;
const PANEL_H: f64 = 380.0;
const MARGIN_L: f64 = 80.0;
const MARGIN_R: f64 = 30.0;
const MARGIN_T: f64 = 90.0;
const MARGIN_B: f64 = 90.0;
/// Panels side by side in a row.
const PER_ROW: usize = 2;
/// From the bottom of one row's panels to the top of the next's: the axis label and legend, then
/// the next panel's title.
const ROW_GAP: f64 = MARGIN_B + 50.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step giving about `n` intervals over `span`.
fn nice_step(span: f64, n: f64) -> f64 {
    let raw = (span / n).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn label(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1e4 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').to_string()
    }
}

/// Renders the whole figure: `xs` are the swept values (ticks on the x axis).
pub fn render(title: &str, subtitle: &str, x_label: &str, xs: &[f64], panels: &[Panel]) -> String {
    let columns = panels.len().clamp(1, PER_ROW);
    let rows = panels.len().div_ceil(PER_ROW).max(1);
    let width = MARGIN_L + columns as f64 * (PANEL_W + MARGIN_L + MARGIN_R);
    let height = MARGIN_T + PANEL_H + MARGIN_B + (rows - 1) as f64 * (PANEL_H + ROW_GAP);
    let mut s = String::new();
    write_heading(&mut s, width, height, title, subtitle);
    let x_range = log2_range(xs);
    for (pi, panel) in panels.iter().enumerate() {
        let (y_range, ticks) = y_scale(panel);
        let (row, column) = (pi / PER_ROW, pi % PER_ROW);
        let frame = Frame {
            ox: MARGIN_L + column as f64 * (PANEL_W + MARGIN_L + MARGIN_R),
            oy: MARGIN_T + row as f64 * (PANEL_H + ROW_GAP),
            x_range,
            y_range,
            log_y: panel.log_y,
        };
        let _ = writeln!(s, r#"<g class="panel">"#);
        write_grid(&mut s, &frame, panel, &ticks, xs);
        write_axis_labels(&mut s, &frame, panel, x_label);
        write_series(&mut s, &frame, panel);
        let _ = writeln!(s, "</g>");
    }
    let _ = writeln!(s, "</svg>");
    s
}

/// Where a panel lies in the figure, and where a value falls in it.
struct Frame {
    /// The top left corner of the plotting area.
    ox: f64,
    oy: f64,
    /// The log-2 x values at the left and right edges.
    x_range: (f64, f64),
    /// The y values (decades on a log axis) at the bottom and top edges.
    y_range: (f64, f64),
    log_y: bool,
}

impl Frame {
    fn px(&self, x: f64) -> f64 {
        let (lx0, lx1) = self.x_range;
        self.ox + (x.log2() - lx0) / (lx1 - lx0) * PANEL_W
    }

    fn py(&self, y: f64) -> f64 {
        let (y0, y1) = self.y_range;
        let f = if self.log_y {
            (y.log10() - y0) / (y1 - y0)
        } else {
            (y - y0) / (y1 - y0)
        };
        self.oy + PANEL_H - f * PANEL_H
    }
}

impl Panel {
    /// Whether a y value can be drawn: finite, and positive on a log axis.
    fn drawable(&self, y: f64) -> bool {
        y.is_finite() && (!self.log_y || y > 0.0)
    }
}

/// The `<svg>` element, its background, the title and the subtitle.
fn write_heading(s: &mut String, width: f64, height: f64, title: &str, subtitle: &str) {
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="13">"#
    );
    let _ = writeln!(
        s,
        r##"<rect x="0" y="0" width="{width:.0}" height="{height:.0}" fill="#ffffff"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.0}" y="28" text-anchor="middle" font-size="17" font-weight="bold">{}</text>"#,
        width / 2.0,
        esc(title)
    );
    let _ = writeln!(
        s,
        r##"<text x="{:.0}" y="48" text-anchor="middle" fill="#555555">{}</text>"##,
        width / 2.0,
        esc(subtitle)
    );
}

/// The x axis's log-2 range: a quarter octave beyond the positive swept values, an octave either
/// side of a lone one.
fn log2_range(xs: &[f64]) -> (f64, f64) {
    let (x_min, x_max) = xs
        .iter()
        .filter(|x| **x > 0.0)
        .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
    if x_min <= x_max {
        let (a, b) = (x_min.log2(), x_max.log2());
        if (b - a).abs() < 1e-9 {
            (a - 1.0, b + 1.0)
        } else {
            (a - 0.25, b + 0.25)
        }
    } else {
        (0.0, 1.0)
    }
}

/// A panel's y range and ticks: [0, nice max] linear, or whole decades around the data (ticks at
/// 1, 2 and 5 of each) on a log axis.
fn y_scale(panel: &Panel) -> ((f64, f64), Vec<f64>) {
    let ys: Vec<f64> = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|y| panel.drawable(*y))
        .collect();
    let y_hi = ys.iter().copied().fold(0.0f64, f64::max);
    let y_lo = ys.iter().copied().fold(f64::MAX, f64::min);
    if panel.log_y && !ys.is_empty() {
        let d0 = y_lo.log10().floor();
        let d1 = y_hi.log10().ceil().max(d0 + 1.0);
        let mut t = Vec::new();
        let mut d = d0;
        while d <= d1 + 1e-9 {
            for m in [1.0, 2.0, 5.0] {
                let v = m * 10f64.powf(d);
                if v >= 10f64.powf(d0) - 1e-12 && v <= 10f64.powf(d1) + 1e-12 {
                    t.push(v);
                }
            }
            d += 1.0;
        }
        ((d0, d1), t)
    } else {
        let top = if y_hi > 0.0 { y_hi * 1.1 } else { 1.0 };
        let step = nice_step(top, 5.0);
        let top = (top / step).ceil() * step;
        let t = (0..=((top / step).round() as usize))
            .map(|i| i as f64 * step)
            .collect();
        ((0.0, top), t)
    }
}

/// The panel's title and border, and a labelled grid line per y tick and per swept value.
fn write_grid(s: &mut String, f: &Frame, panel: &Panel, ticks: &[f64], xs: &[f64]) {
    let (ox, oy) = (f.ox, f.oy);
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        ox + PANEL_W / 2.0,
        oy - 14.0,
        esc(&panel.title)
    );
    let _ = writeln!(
        s,
        r##"<rect x="{ox:.1}" y="{oy:.1}" width="{PANEL_W:.1}" height="{PANEL_H:.1}" fill="none" stroke="#444444"/>"##
    );
    for t in ticks {
        let y = f.py(*t);
        let _ = writeln!(
            s,
            r##"<line x1="{ox:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#dddddd"/>"##,
            ox + PANEL_W
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            ox - 6.0,
            y + 4.0,
            esc(&label(*t))
        );
    }
    for x in xs {
        let x_px = f.px(*x);
        let _ = writeln!(
            s,
            r##"<line x1="{x_px:.1}" y1="{oy:.1}" x2="{x_px:.1}" y2="{:.1}" stroke="#eeeeee"/>"##,
            oy + PANEL_H
        );
        let _ = writeln!(
            s,
            r#"<text x="{x_px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            oy + PANEL_H + 18.0,
            esc(&label(*x))
        );
    }
}

/// The names of the axes: under the panel, and turned along its left side.
fn write_axis_labels(s: &mut String, f: &Frame, panel: &Panel, x_label: &str) {
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{} (log scale)</text>"#,
        f.ox + PANEL_W / 2.0,
        f.oy + PANEL_H + 42.0,
        esc(x_label)
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate({:.1},{:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        f.ox - 58.0,
        f.oy + PANEL_H / 2.0,
        esc(&format!(
            "{}{}",
            panel.y_label,
            if panel.log_y { " (log scale)" } else { "" }
        ))
    );
}

/// Each series: its line (where it has two points or more), its points, and its legend entry, in
/// a row under the panel's x-axis label.
fn write_series(s: &mut String, f: &Frame, panel: &Panel) {
    let mut legend_x = 0.0;
    for (si, series) in panel.series.iter().enumerate() {
        let color = COLORS[si % COLORS.len()];
        let pts: Vec<(f64, f64)> = series
            .points
            .iter()
            .copied()
            .filter(|(x, y)| *x > 0.0 && panel.drawable(*y))
            .map(|(x, y)| (f.px(x), f.py(y)))
            .collect();
        if pts.len() > 1 {
            let path: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
            let _ = writeln!(
                s,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{}/>"#,
                path.join(" "),
                dash_attr(series)
            );
        }
        for (x, y) in &pts {
            let _ = writeln!(
                s,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{color}"/>"#
            );
        }
        let (lx, ly) = (f.ox + legend_x, f.oy + PANEL_H + 68.0);
        legend_x += 52.0 + 7.2 * series.name.chars().count() as f64;
        write_legend_entry(s, lx, ly, color, series);
    }
}

/// A short stroke of the series' line at (`lx`, `ly`), and its name beside it.
fn write_legend_entry(s: &mut String, lx: f64, ly: f64, color: &str, series: &Series) {
    let _ = writeln!(
        s,
        r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{color}" stroke-width="2"{}/>"#,
        lx,
        ly - 4.0,
        lx + 24.0,
        ly - 4.0,
        dash_attr(series)
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{ly:.1}">{}</text>"#,
        lx + 30.0,
        esc(&series.name)
    );
}

/// The series' `stroke-dasharray` attribute, with its leading space (empty for a solid line).
fn dash_attr(series: &Series) -> String {
    series
        .dash
        .map(|d| format!(r#" stroke-dasharray="{d}""#))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_balanced_svg() {
        let xs = [1.0, 8.0, 64.0, 256.0];
        let svg = render(
            "fan-out <test> & more",
            "sub",
            "consumers",
            &xs,
            &[
                Panel {
                    title: "delivered".into(),
                    y_label: "MB/s".into(),
                    series: vec![Series {
                        name: "on".into(),
                        points: xs.iter().map(|x| (*x, x * 10.0)).collect(),
                        dash: None,
                    }],
                    log_y: false,
                },
                Panel {
                    title: "latency".into(),
                    y_label: "ms".into(),
                    series: vec![Series {
                        name: "off".into(),
                        points: xs.iter().map(|x| (*x, x * 0.01)).collect(),
                        dash: Some("6,4"),
                    }],
                    log_y: true,
                },
            ],
        );
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("&lt;test&gt; &amp; more"));
        assert_eq!(svg.matches("<g").count(), svg.matches("</g>").count());
        assert_eq!(svg.matches("<polyline").count(), 2);
    }

    /// A sweep with every kind of line: linear and log panels, solid and dashed series, a series
    /// with one point (no line), points left out (zero, NaN, negative on the log axis).
    fn sample() -> String {
        let xs = [1.0, 4.0, 16.0, 64.0];
        render(
            "shoal bench fanout: 1000 B messages, 1 partition, 1 producer",
            "produce rate 1,000 msg/s, acks=1, tail from latest, compression none; shoal; 5 s measured per run",
            "consumers per partition",
            &xs,
            &[
                Panel {
                    title: "delivered throughput".into(),
                    y_label: "MB/s delivered (all consumers)".into(),
                    series: vec![
                        Series {
                            name: "shoal, coalescing on".into(),
                            points: vec![(1.0, 0.95), (4.0, 3.9), (16.0, 15.2), (64.0, 61.0)],
                            dash: None,
                        },
                        Series {
                            name: "shoal, coalescing off".into(),
                            points: vec![(1.0, 0.95), (4.0, 3.8), (16.0, f64::NAN), (0.0, 2.0)],
                            dash: Some("3,3"),
                        },
                        Series {
                            name: "raw TCP baseline".into(),
                            points: vec![(16.0, 2_400.0)],
                            dash: Some("8,4"),
                        },
                    ],
                    log_y: false,
                },
                Panel {
                    title: "end-to-end latency, p99".into(),
                    y_label: "p99 e2e latency (ms)".into(),
                    series: vec![
                        Series {
                            name: "shoal, coalescing on".into(),
                            points: vec![(1.0, 0.8), (4.0, 1.3), (16.0, 0.0), (64.0, 240.0)],
                            dash: None,
                        },
                        Series {
                            name: "shoal, coalescing off".into(),
                            points: vec![(1.0, 0.9), (4.0, -1.0), (16.0, 35.0), (64.0, 410.0)],
                            dash: Some("3,3"),
                        },
                    ],
                    log_y: true,
                },
            ],
        )
    }

    /// One swept value, and a log panel with nothing to draw.
    fn lone_point() -> String {
        render(
            "one point",
            "",
            "producers",
            &[8.0],
            &[Panel {
                title: "latency".into(),
                y_label: "ms".into(),
                series: vec![Series {
                    name: "none".into(),
                    points: vec![(8.0, f64::NAN)],
                    dash: None,
                }],
                log_y: true,
            }],
        )
    }

    /// The figure is the same, byte for byte, as when the golden file was written.
    #[test]
    fn renders_the_golden_svg() {
        let svg = sample() + &lone_point();
        assert_eq!(svg, include_str!("plot_golden.svg"));
    }

    /// Four panels: two rows of two, the second row below the first's legends.
    #[test]
    fn panels_go_two_to_a_row() {
        let panel = |title: &str| Panel {
            title: title.into(),
            y_label: "y".into(),
            series: vec![Series {
                name: "s".into(),
                points: vec![(1.0, 1.0), (2.0, 2.0)],
                dash: None,
            }],
            log_y: false,
        };
        let panels: Vec<Panel> = ["a", "b", "c", "d"].into_iter().map(panel).collect();
        let svg = render("t", "s", "x", &[1.0, 2.0], &panels);
        let width = MARGIN_L + 2.0 * (PANEL_W + MARGIN_L + MARGIN_R);
        let height = MARGIN_T + 2.0 * PANEL_H + ROW_GAP + MARGIN_B;
        assert!(
            svg.contains(&format!(r#"width="{width:.0}" height="{height:.0}""#)),
            "{}",
            svg.lines().next().unwrap()
        );
        let second_row = MARGIN_T + PANEL_H + ROW_GAP;
        let frames: Vec<(f64, f64)> = svg
            .lines()
            .filter(|l| l.contains(r##"fill="none" stroke="#444444""##))
            .map(|l| {
                let attr = |name: &str| -> f64 {
                    let at = l.find(&format!(r#" {name}=""#)).unwrap() + name.len() + 3;
                    l[at..].split('"').next().unwrap().parse().unwrap()
                };
                (attr("x"), attr("y"))
            })
            .collect();
        let right = MARGIN_L + PANEL_W + MARGIN_L + MARGIN_R;
        assert_eq!(
            frames,
            vec![
                (MARGIN_L, MARGIN_T),
                (right, MARGIN_T),
                (MARGIN_L, second_row),
                (right, second_row)
            ]
        );
        assert_eq!(svg.matches("<polyline").count(), 4);
    }

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(100.0, 5.0), 20.0);
        assert_eq!(nice_step(7.0, 5.0), 2.0);
        assert_eq!(nice_step(0.3, 5.0), 0.1);
    }
}
