//! The request path: from a request's attributes to its cell, its decision
//! and what the host does about it. Nothing here makes a host call beyond
//! the attribute reads the classification needs.

pub(crate) mod cell_table;
pub mod charge;
pub mod classify;
pub mod handler;
pub mod new_cells;
pub(crate) mod path;
pub mod record;
pub mod reject;
