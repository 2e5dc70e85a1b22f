//! Line charts for the benchmarks' docs (SVG through `plotters`, no fonts needed).

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

/// One line per series over the labelled runs (x), `y_label` on the y axis.
pub fn lines(
    path: &Path,
    title: &str,
    runs: &[String],
    y_label: &str,
    series: &[(String, Vec<f64>)],
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (900, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let y_max = series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .fold(1.0, f64::max)
        * 1.1;
    let n = runs.len().max(2);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.2..(n - 1) as f64 + 0.2, 0.0..y_max)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let labels = runs.to_vec();
    chart
        .configure_mesh()
        .x_labels(n)
        // Runs sit on whole numbers; anything between them gets no label.
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() > 1e-6 || *x < -1e-6 {
                String::new()
            } else {
                labels.get(x.round() as usize).cloned().unwrap_or_default()
            }
        })
        .y_desc(y_label)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, (name, ys)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let points: Vec<(f64, f64)> = ys.iter().enumerate().map(|(x, y)| (x as f64, *y)).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
