//! Checks the networking kinds share. VirtualService, DestinationRule, Gateway and
//! AuthorizationPolicy have rooms of their own (`virtual_service`, `destination_rule`,
//! `gateway`, `authorization`).

/// Kubernetes' DNS-1123 label: what Istio requires of subset names.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub(crate) fn check_port(field: &str, number: i64) -> Result<(), String> {
    if (1..=65535).contains(&number) {
        Ok(())
    } else {
        Err(format!("{field}: port number {number} is not in 1-65535"))
    }
}
