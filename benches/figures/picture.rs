//! Pictures of what a figure measured, drawn as SVG with plotters: a timeline per case, each
//! with its lanes (a child's running and paused spans, its writes), its marks in time (a
//! takeover) and its caption, the one line of the report that says the case's numbers.
//!
//! Pure drawing: what to draw comes in as data (seconds on one axis for every panel), an SVG
//! document comes out; nothing here runs or measures.

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One panel: a case of the figure.
pub struct Panel {
    /// The case's name, the panel's title.
    pub title: String,
    /// What the case showed, under the title: with it, `TITLE: FACTS` is the report's line for
    /// the case, word for word.
    pub facts: String,
    pub lanes: Vec<Lane>,
    /// Instants marked across the whole panel, with their labels (a takeover).
    pub marks: Vec<(f64, String)>,
}

/// One process's row of a panel.
pub struct Lane {
    pub name: String,
    pub spans: Vec<Span>,
    pub writes: Vec<Write>,
    /// Written after the last span (how it ended).
    pub end: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    /// Stopped by SIGSTOP: it exists, but runs nothing.
    Paused,
}

pub struct Span {
    pub from: f64,
    pub to: f64,
    pub state: State,
    /// Drawn inside the span when there is room (the pause's length).
    pub label: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A write of the current holder, accepted.
    Accepted,
    /// A stale holder's write that the resource accepted: the harm.
    StaleAccepted,
    /// A stale holder's write that the resource refused.
    StaleRefused,
}

pub struct Write {
    pub at: f64,
    pub verdict: Verdict,
}

const WIDTH: u32 = 980;
const HEADER: u32 = 64;
const PANEL: u32 = 160;
/// The last panel's extra room, for the time axis's name.
const AXIS: u32 = 24;
const FONT: &str = "sans-serif";

const RUNNING: RGBColor = RGBColor(70, 130, 180);
const PAUSED: RGBColor = RGBColor(200, 200, 200);
const ACCEPTED: RGBColor = RGBColor(40, 150, 60);
const STALE_ACCEPTED: RGBColor = RGBColor(210, 40, 40);
const REFUSED: RGBColor = RGBColor(30, 30, 30);

impl Verdict {
    fn color(self) -> RGBColor {
        match self {
            Verdict::Accepted => ACCEPTED,
            Verdict::StaleAccepted => STALE_ACCEPTED,
            Verdict::StaleRefused => REFUSED,
        }
    }

    fn legend(self) -> &'static str {
        match self {
            Verdict::Accepted => "write accepted",
            Verdict::StaleAccepted => "stale write accepted",
            Verdict::StaleRefused => "stale write refused",
        }
    }
}

/// The panels, one under the other, on one time axis from `x.0` to `x.1` seconds, under `title`;
/// `axis` names that axis. Returns the SVG document.
pub fn timelines(title: &str, axis: &str, x: (f64, f64), panels: &[Panel]) -> String {
    let mut svg = String::new();
    let height = HEADER + PANEL * panels.len() as u32 + AXIS;
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        draw(&root, title, axis, x, panels).expect("draw into a string");
        root.present().expect("finish the SVG");
    }
    svg
}

type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

fn draw(
    root: &DrawingArea<SVGBackend, Shift>,
    title: &str,
    axis: &str,
    x: (f64, f64),
    panels: &[Panel],
) -> Drawn {
    root.fill(&WHITE)?;
    let (header, mut body) = root.split_vertically(HEADER);
    header.draw(&Text::new(
        title.to_owned(),
        (12, 8),
        (FONT, 19).into_font().style(FontStyle::Bold),
    ))?;
    legend(&header)?;
    for (k, panel) in panels.iter().enumerate() {
        let last = k + 1 == panels.len();
        let (area, rest) = body.split_vertically(PANEL + if last { AXIS } else { 0 });
        draw_panel(&area, last.then_some(axis), x, panel)?;
        body = rest;
    }
    Ok(())
}

/// The key to the colours, along the header's bottom.
fn legend(area: &DrawingArea<SVGBackend, Shift>) -> Drawn {
    let small = (FONT, 15).into_font();
    let mut at = 12;
    let swatch =
        |at: i32, color: RGBColor| Rectangle::new([(at, 44), (at + 22, 56)], color.filled());
    for (color, what) in [(RUNNING, "running"), (PAUSED, "paused (SIGSTOP)")] {
        area.draw(&swatch(at, color))?;
        area.draw(&Text::new(what, (at + 28, 43), small.clone()))?;
        at += 40 + 7 * what.len() as i32;
    }
    for verdict in [
        Verdict::Accepted,
        Verdict::StaleAccepted,
        Verdict::StaleRefused,
    ] {
        area.draw(&marker(verdict, (at + 6, 50)))?;
        area.draw(&Text::new(verdict.legend(), (at + 18, 43), small.clone()))?;
        at += 30 + 7 * verdict.legend().len() as i32;
    }
    Ok(())
}

/// A write's mark: a filled circle when accepted, a cross when refused.
fn marker<'a, DB: DrawingBackend + 'a>(
    verdict: Verdict,
    at: (i32, i32),
) -> DynElement<'a, DB, (i32, i32)> {
    let color = verdict.color();
    match verdict {
        Verdict::StaleRefused => {
            let style = color.stroke_width(3);
            (EmptyElement::at(at)
                + PathElement::new(vec![(-6, -6), (6, 6)], style)
                + PathElement::new(vec![(-6, 6), (6, -6)], style))
            .into_dyn()
        }
        _ => (EmptyElement::at(at)
            + Circle::new((0, 0), 6, color.filled())
            + Circle::new((0, 0), 6, BLACK.stroke_width(1)))
        .into_dyn(),
    }
}

fn draw_panel(
    area: &DrawingArea<SVGBackend, Shift>,
    axis: Option<&str>,
    x: (f64, f64),
    panel: &Panel,
) -> Drawn {
    let (head, plot) = area.split_vertically(44);
    let bold = (FONT, 16).into_font().style(FontStyle::Bold);
    head.draw(&Text::new(panel.title.clone(), (12, 6), bold))?;
    head.draw(&Text::new(
        panel.facts.clone(),
        (12, 26),
        (FONT, 14).into_font(),
    ))?;
    let lanes = panel.lanes.len() as f64;
    let mut chart = ChartBuilder::on(&plot)
        .margin_left(8)
        .margin_right(24)
        .x_label_area_size(22 + if axis.is_some() { AXIS } else { 0 })
        .y_label_area_size(84)
        .build_cartesian_2d(x.0..x.1, 0.0..lanes)?;
    let mut mesh = chart.configure_mesh();
    mesh.disable_mesh()
        .y_labels(0)
        .x_label_style((FONT, 13))
        .x_label_formatter(&|s| {
            if s.fract() == 0.0 {
                format!("{s:.0}")
            } else {
                format!("{s:.1}")
            }
        });
    if let Some(axis) = axis {
        mesh.x_desc(axis).axis_desc_style((FONT, 14));
    }
    mesh.draw()?;
    let base = plot.get_base_pixel();
    for (k, lane) in panel.lanes.iter().enumerate() {
        // The first lane on top.
        let y = lanes - 1.0 - k as f64;
        draw_lane(&mut chart, lane, y)?;
        for w in &lane.writes {
            let (px, py) = chart.backend_coord(&(w.at, y + 0.5));
            plot.draw(&marker(w.verdict, (px - base.0, py - base.1)))?;
        }
        let (px, py) = chart.backend_coord(&(x.0, y + 0.5));
        let style =
            TextStyle::from((FONT, 15).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
        plot.draw(&Text::new(
            lane.name.clone(),
            (px - base.0 - 8, py - base.1),
            style,
        ))?;
    }
    for (at, label) in &panel.marks {
        let line = DashedLineSeries::new([(*at, 0.0), (*at, lanes)], 5, 4, BLACK.stroke_width(1));
        chart.draw_series(line)?;
        let style = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Top));
        let label = EmptyElement::at((*at, lanes)) + Text::new(label.clone(), (4, 1), style);
        chart.draw_series([label])?;
    }
    Ok(())
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// One lane at height `y`: its spans (with their labels) and how it ended.
fn draw_lane(chart: &mut Chart, lane: &Lane, y: f64) -> Drawn {
    let spans = lane.spans.iter().map(|s| {
        let color = match s.state {
            State::Running => RUNNING,
            State::Paused => PAUSED,
        };
        Rectangle::new([(s.from, y + 0.22), (s.to, y + 0.78)], color.filled())
    });
    chart.draw_series(spans)?;
    let left = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let labels = lane.spans.iter().filter_map(|s| {
        let text = s.label.clone()?;
        Some(EmptyElement::at((s.from, y + 0.5)) + Text::new(text, (5, 0), left.clone()))
    });
    chart.draw_series(labels)?;
    let end = lane.spans.iter().map(|s| s.to).fold(f64::MIN, f64::max);
    if let Some(text) = &lane.end {
        let label =
            EmptyElement::at((end, y + 0.5)) + Text::new(text.clone(), (10, 0), left.clone());
        chart.draw_series([label])?;
    }
    Ok(())
}
