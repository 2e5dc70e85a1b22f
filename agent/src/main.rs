//! `sluice`: the node agent and its command line.

mod config;
mod dataset;
mod secret;
mod source;

fn main() {
    println!("sluice");
}
