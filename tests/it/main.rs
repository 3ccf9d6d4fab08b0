//! System tests: real agents, collectors, msrctl and SIPp over loopback.
//! One test binary (matklad, "delete cargo integration tests").
mod agent;
mod balancing;
mod cluster;
mod collector;
mod control;
mod front_ends;
mod health;
mod kamailio;
mod legs;
mod lifecycle;
mod logs;
mod restart;
mod selection;
