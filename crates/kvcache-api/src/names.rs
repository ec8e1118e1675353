//! The name, address and path checks that several rules share: DNS labels, `host:port`
//! addresses, disk-tier paths and tenant (domain) names.

/// The device tree no member mounts: device plugins inject the granted devices.
pub(crate) const INFINIBAND_DIR: &str = "/dev/infiniband";

/// The longest DNS label.
pub const MAX_LABEL: usize = 63;

/// Whether `s` is a DNS-1123 label: lowercase letters, digits and `-`, at most 63 characters,
/// starting and ending with a letter or digit (Namespaces, most object names, role names).
pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_LABEL
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is a DNS-1123 subdomain: dot-separated DNS labels, at most 253 characters
/// (PriorityClass and most other cluster-scoped object names).
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Whether `s` is a DNS-1035 label: a DNS-1123 label that starts with a letter (Service names).
pub fn is_dns1035_label(s: &str) -> bool {
    is_dns_label(s) && s.as_bytes()[0].is_ascii_lowercase()
}

/// The path rules of a disk tier, in the order a user would fix them.
pub fn tier_path_problem(path: &str) -> Option<&'static str> {
    if path != path.trim_matches([' ', '\t']) {
        return Some("must not start or end with spaces or tabs");
    }
    if !path.starts_with('/') {
        return Some("must be absolute");
    }
    if path.trim_start_matches('/').is_empty() {
        return Some("must not be /");
    }
    if path.split('/').any(|c| c == "..") {
        return Some("must not contain a .. component");
    }
    let with_slash = if path.ends_with('/') {
        path.to_owned()
    } else {
        format!("{path}/")
    };
    let ib = format!("{INFINIBAND_DIR}/");
    if with_slash.starts_with(&ib) || ib.starts_with(&with_slash) {
        return Some("must not equal, be inside or contain /dev/infiniband");
    }
    if !is_normalized(path) {
        return Some(TIER_PATH_NOT_NORMALIZED);
    }
    if SYSTEM_DIRS
        .iter()
        .any(|d| path == *d || path.starts_with(&format!("{d}/")))
    {
        return Some(TIER_PATH_IN_SYSTEM_DIR);
    }
    None
}

/// Folders of the node's system a disk tier must not be written into: the kernel's views and
/// devices, and the node's configuration.
pub(crate) const SYSTEM_DIRS: [&str; 4] = ["/proc", "/sys", "/dev", "/etc"];

/// Why a tier path under [`SYSTEM_DIRS`] is refused.
pub(crate) const TIER_PATH_IN_SYSTEM_DIR: &str =
    "must not be /proc, /sys, /dev or /etc, or inside them: those are the node's own";

/// Why a tier path that is not in its normal form is refused.
pub(crate) const TIER_PATH_NOT_NORMALIZED: &str = "must be written in its normal form: no '.' component, no '//', no trailing '/' (the same folder written two ways would be two tiers to the operator)";

/// Whether an absolute path is in its normal form: no `.` or empty component, no trailing `/`.
fn is_normalized(path: &str) -> bool {
    path.strip_prefix('/')
        .is_some_and(|rest| rest.split('/').all(|c| !c.is_empty() && c != "."))
}

/// Whether an address is `host:port` (bracketed IPv6 hosts allowed).
pub fn is_host_port(address: &str) -> bool {
    let Some((host, port)) = address.rsplit_once(':') else {
        return false;
    };
    let port_ok = !port.is_empty()
        && port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p));
    let host_ok = if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        !inner.is_empty()
            && inner
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
    } else {
        !host.is_empty()
            && !host
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, ':' | '/' | '[' | ']'))
    };
    port_ok && host_ok
}

/// Why a tenant (domain) name is refused by the store or by the DNS-1123 label rule.
pub fn domain_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("must not be empty");
    }
    if name.starts_with('_') {
        return Some("must not start with '_' (the store reserves those tenant ids)");
    }
    if name.len() > MAX_LABEL {
        return Some("must be at most 63 characters (a DNS-1123 label)");
    }
    if !is_dns_label(name) {
        return Some(
            "must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending with a letter or digit",
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        for ok in ["a", "a-1", "team-a", "0abc"] {
            assert!(is_dns_label(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        assert!(is_dns1035_label("svc-1"));
        assert!(
            !is_dns1035_label("1svc"),
            "a Service name starts with a letter"
        );
    }
}
