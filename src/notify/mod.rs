//! Notifications to the operators' webhooks: their configuration, the
//! messages, their bodies (templates), their delivery.

pub mod config;
pub mod message;
pub mod template;
pub mod webhooks;
