//! Agent ⇄ collector in virtual time (`system_tests::pair`): the cores
//! of both daemons joined in memory.
mod capabilities;
mod lifecycle;
