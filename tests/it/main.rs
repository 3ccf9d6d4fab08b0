//! System tests: real agents, collectors, msrctl and SIPp over loopback.
//! One test binary (matklad, "delete cargo integration tests").
mod agent;
mod balancing;
mod cluster;
mod collector;
mod control;
mod engine;
mod failover;
mod flood;
mod front_ends;
mod guides;
mod health;
mod kamailio;
mod legs;
mod lifecycle;
mod logs;
mod monitoring;
mod quickstart;
mod reload;
mod restart;
mod rtpengine;
mod selection;
mod stream;
mod tls;
mod torture;
mod unfollowed;
