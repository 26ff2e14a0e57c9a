//! Notifications to the operators' webhooks: their configuration, the
//! messages, their delivery.

pub mod webhooks;
