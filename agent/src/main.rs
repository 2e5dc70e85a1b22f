//! `sluice`: the node agent and its command line.

mod dataset;
mod source;

fn main() {
    println!("sluice");
}
