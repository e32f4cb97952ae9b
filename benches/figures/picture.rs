//! Pictures of what a figure measured, drawn as SVG with plotters: a timeline per case, each
//! with its lanes (a child's running and paused spans, its writes), its marks in time (a
//! takeover) and its caption, the one line of the report that says the case's numbers.
//!
//! Pure drawing: what to draw comes in as data (seconds on one axis for every panel), an SVG
//! document comes out; nothing here runs or measures.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One panel: a case of the figure.
pub struct Panel {
    /// The report's line for the case, drawn as the panel's title, word for word.
    pub caption: String,
    pub lanes: Vec<Lane>,
    /// Instants marked across the whole panel, with their labels (a takeover).
    pub marks: Vec<(f64, String)>,
}

/// One process's row of a panel.
pub struct Lane {
    pub name: String,
    pub spans: Vec<Span>,
    pub writes: Vec<Write>,
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
const HEADER: u32 = 70;
const PANEL: u32 = 150;
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
    let height = HEADER + PANEL * panels.len() as u32;
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
    let (header, body) = root.split_vertically(HEADER);
    header.draw(&Text::new(
        title.to_owned(),
        (12, 8),
        (FONT, 18).into_font().style(FontStyle::Bold),
    ))?;
    legend(&header)?;
    for (area, panel) in body.split_evenly((panels.len(), 1)).iter().zip(panels) {
        draw_panel(area, axis, x, panel)?;
    }
    Ok(())
}

/// The key to the colours, along the header's bottom.
fn legend(area: &DrawingArea<SVGBackend, Shift>) -> Drawn {
    let small = (FONT, 13).into_font();
    let mut at = 12;
    let swatch =
        |at: i32, color: RGBColor| Rectangle::new([(at, 44), (at + 22, 56)], color.filled());
    for (color, what) in [(RUNNING, "running"), (PAUSED, "paused (SIGSTOP)")] {
        area.draw(&swatch(at, color))?;
        area.draw(&Text::new(what, (at + 28, 43), small.clone()))?;
        at += 40 + 8 * what.len() as i32;
    }
    for verdict in [
        Verdict::Accepted,
        Verdict::StaleAccepted,
        Verdict::StaleRefused,
    ] {
        area.draw(&marker(verdict, (at + 6, 50)))?;
        area.draw(&Text::new(verdict.legend(), (at + 18, 43), small.clone()))?;
        at += 30 + 8 * verdict.legend().len() as i32;
    }
    Ok(())
}

/// A write's mark: a filled circle when accepted, a cross when refused.
fn marker<'a, DB: DrawingBackend + 'a>(
    verdict: Verdict,
    (x, y): (i32, i32),
) -> DynElement<'a, DB, (i32, i32)> {
    let color = verdict.color();
    match verdict {
        Verdict::StaleRefused => {
            let style = color.stroke_width(3);
            (EmptyElement::at((x, y))
                + PathElement::new(vec![(-6, -6), (6, 6)], style)
                + PathElement::new(vec![(-6, 6), (6, -6)], style))
            .into_dyn()
        }
        _ => (EmptyElement::at((x, y))
            + Circle::new((0, 0), 6, color.filled())
            + Circle::new((0, 0), 6, BLACK.stroke_width(1)))
        .into_dyn(),
    }
}

fn draw_panel(
    area: &DrawingArea<SVGBackend, Shift>,
    axis: &str,
    x: (f64, f64),
    panel: &Panel,
) -> Drawn {
    let lanes = panel.lanes.len() as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.caption, (FONT, 14))
        .margin(8)
        .margin_right(20)
        .x_label_area_size(32)
        .y_label_area_size(80)
        .build_cartesian_2d(x.0..x.1, 0.0..lanes)
        .map_err(plain)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc(axis)
        .x_label_formatter(&|s| format!("{s:.0}"))
        .draw()
        .map_err(plain)?;
    for (k, lane) in panel.lanes.iter().enumerate() {
        // The first lane on top.
        let y = lanes - 1.0 - k as f64;
        let spans = lane.spans.iter().map(|s| {
            let color = match s.state {
                State::Running => RUNNING,
                State::Paused => PAUSED,
            };
            Rectangle::new([(s.from, y + 0.25), (s.to, y + 0.75)], color.filled())
        });
        chart.draw_series(spans).map_err(plain)?;
        let labels = lane.spans.iter().filter_map(|s| {
            let text = s.label.clone()?;
            let style =
                TextStyle::from((FONT, 12).into_font()).pos(Pos::new(HPos::Center, VPos::Center));
            Some(Text::new(text, ((s.from + s.to) / 2.0, y + 0.5), style))
        });
        chart.draw_series(labels).map_err(plain)?;
        let (px, py) = chart.backend_coord(&(x.0, y + 0.5));
        let style =
            TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
        area.draw(&Text::new(lane.name.clone(), (px - 8, py), style))?;
        for w in &lane.writes {
            let at = chart.backend_coord(&(w.at, y + 0.5));
            area.draw(&marker(w.verdict, at))?;
        }
    }
    for (at, label) in &panel.marks {
        let line = DashedLineSeries::new([(*at, 0.0), (*at, lanes)], 5, 4, BLACK.stroke_width(1));
        chart.draw_series(line).map_err(plain)?;
        let style = TextStyle::from((FONT, 12).into_font()).pos(Pos::new(HPos::Left, VPos::Top));
        chart
            .draw_series([Text::new(label.clone(), (*at, lanes), style)])
            .map_err(plain)?;
    }
    Ok(())
}

/// The chart builder's error, as the drawing area's (both wrap the backend's).
fn plain(e: DrawingAreaErrorKind<std::io::Error>) -> DrawingAreaErrorKind<std::io::Error> {
    e
}
