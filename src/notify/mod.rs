//! Notifications to the operators' webhooks: their configuration, the
//! messages, their delivery.

pub mod config;
pub mod message;
pub mod webhooks;
