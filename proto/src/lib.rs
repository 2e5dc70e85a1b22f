//! Generated gRPC code for Sluice's services.

/// Agent-to-agent block transfer.
pub mod block {
    tonic::include_proto!("sluice.block.v1");
}
