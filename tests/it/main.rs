//! System tests: real agents, collectors, msrctl and SIPp over loopback.
//! One test binary (matklad, "delete cargo integration tests").
mod agent;
mod collector;
mod health;
mod lifecycle;
mod selection;
