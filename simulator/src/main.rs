//! `sluice-simulate`: runs traffic scenarios through the real controller and
//! the filter's agents on a simulated clock and prints accuracy metrics
//! (`just simulate`; docs/accuracy.md).

use std::process::ExitCode;

use clap::Parser;
use sluice_simulator::command::{SimulateArgs, run};

fn main() -> ExitCode {
    run(&SimulateArgs::parse())
}
