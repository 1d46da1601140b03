//! `guildhall bench`.

use std::io::Write;

use clap::{Args, Subcommand};
use guildhall::bench::{CallsConfig, CallsReport, Stage};
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    which: Which,
}

#[derive(Debug, Subcommand)]
enum Which {
    /// Per-call overhead against a direct call and a bare ractor actor, breaker cost, crash
    /// recovery time, and the cost of spawning many supervised tools.
    Calls(CallsArgs),
}

#[derive(Debug, Args)]
struct CallsArgs {
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Measurement rounds (each runs one batch of every contender).
    #[arg(long, default_value_t = CallsConfig::default().rounds)]
    rounds: usize,
    /// Calls per batch.
    #[arg(long, default_value_t = CallsConfig::default().batch)]
    batch: usize,
    /// Crashes timed for the recovery percentiles.
    #[arg(long, default_value_t = CallsConfig::default().crashes)]
    crashes: usize,
    /// Tools started for the spawn measurement.
    #[arg(long, default_value_t = CallsConfig::default().spawn_tools)]
    spawn_tools: usize,
}

/// Shows phases on a progress bar when stderr is a terminal; hidden otherwise.
struct Bar(ProgressBar);

impl Stage for Bar {
    fn phase(&self, name: &str, total: u64) {
        self.0.set_length(total);
        self.0.set_position(0);
        self.0.set_message(name.to_owned());
    }

    fn step(&self) {
        self.0.inc(1);
    }
}

pub(crate) async fn run(args: BenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    match args.which {
        Which::Calls(a) => {
            let config = CallsConfig {
                rounds: a.rounds.max(1),
                batch: a.batch.max(1),
                crashes: a.crashes.max(1),
                spawn_tools: a.spawn_tools.max(1),
            };
            let bar = ProgressBar::new(0).with_style(
                ProgressStyle::with_template("{msg:>15} [{bar:30}] {pos}/{len}")?.progress_chars("=> "),
            );
            // Measure from a task on the runtime's workers, where a server's callers live,
            // not from the thread blocked in `block_on`.
            let stage = Bar(bar.clone());
            let report = tokio::spawn(async move { guildhall::bench::calls(config, &stage).await }).await?;
            bar.finish_and_clear();
            let mut out = std::io::stdout().lock();
            if a.json {
                writeln!(out, "{}", serde_json::to_string(&report)?)?;
            } else {
                table(&mut out, &report)?;
            }
            Ok(())
        }
    }
}

fn table(out: &mut impl Write, r: &CallsReport) -> std::io::Result<()> {
    writeln!(out, "{:<34} {:>12}  target", "measurement", "value")?;
    let rows = [
        ("direct call (ns)", r.direct_ns, ""),
        ("bare ractor call (ns)", r.raw_ractor_ns, "baseline"),
        ("guildhall pipeline call (ns)", r.pipeline_ns, ""),
        ("  with JSON in/out (ns)", r.json_pipeline_ns, ""),
        ("overhead ratio", r.overhead_ratio, "<= 2"),
        ("breaker check (ns)", r.breaker_check_ns, "< 100"),
        ("crash -> serving p50 (us)", r.crash_recovery_p50_us, ""),
        ("crash -> serving p99 (us)", r.crash_recovery_p99_us, "<= 100"),
        ("spawn tools (ms)", r.spawn_ms, "< 100 for 10,000"),
        ("resident bytes per tool", r.bytes_per_tool, "<= 8192"),
    ];
    for (name, value, target) in rows {
        writeln!(out, "{name:<34} {value:>12.2}  {target}")?;
    }
    writeln!(out, "{:<34} {:>12}", "tools spawned", r.spawn_tools)
}
