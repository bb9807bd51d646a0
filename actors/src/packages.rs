//! Package specs accepted by `install_package_in_sandbox`. They reach the
//! installer as separate arguments after `--`, never through a shell, and
//! anything that looks like an option is refused, so a caller cannot switch
//! the index or read a requirements file from the sandbox's host.

use crate::error::{Result, SandboxError};
use sandbox_runtime::agent::Package;

const MAX_SPEC: usize = 512;
const MAX_SPECS: usize = 32;

/// Splits `spec` (one or more requirements separated by spaces) and checks
/// each: it starts with a letter or digit and uses only characters of PEP 508
/// requirements without URLs.
pub fn parse_specs(spec: &str) -> Result<Vec<String>> {
    let bad = |why: String| Err(SandboxError::InvalidArgument(why));
    if spec.len() > MAX_SPEC {
        return bad(format!("package_name is longer than {MAX_SPEC} characters"));
    }
    let specs: Vec<String> = spec.split_whitespace().map(str::to_string).collect();
    if specs.is_empty() {
        return bad("package_name is empty; give a name such as \"numpy\" or \"pandas==2.2.2\"".into());
    }
    if specs.len() > MAX_SPECS {
        return bad(format!("at most {MAX_SPECS} packages at once"));
    }
    for s in &specs {
        let first_ok = s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
        let chars_ok = s
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-[],<>=!~*+".contains(c));
        if !first_ok || !chars_ok {
            return bad(format!(
                "{s:?} is not a package requirement: use a name with an optional version, such as \"numpy\" or \"pandas>=2\" (options and URLs are not accepted)"
            ));
        }
    }
    Ok(specs)
}

/// The distribution name of a requirement, normalised as PyPI does (PEP 503).
pub fn dist_name(spec: &str) -> String {
    let name: String = spec
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || "._-".contains(*c))
        .collect();
    normalise(&name)
}

pub fn normalise(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut sep = false;
    for c in name.chars() {
        if "._-".contains(c) {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// The installed version of every requirement in `spec`, if all are present.
pub fn installed_versions(spec: &str, packages: &[Package]) -> Option<Vec<Package>> {
    spec.split_whitespace()
        .map(|s| {
            let want = dist_name(s);
            packages.iter().find(|p| normalise(&p.name) == want).cloned()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_urls_and_shell_are_refused() {
        for bad in [
            "--index-url http://evil/simple six",
            "-r /etc/passwd",
            "six; rm -rf /",
            "six && id",
            "$(id)",
            "`id`",
            "git+https://x/y.git",
            "/etc/passwd",
            "",
            "   ",
        ] {
            assert!(parse_specs(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn ordinary_requirements_pass() {
        assert_eq!(parse_specs("six").unwrap(), vec!["six"]);
        assert_eq!(parse_specs("pandas==2.2.2 numpy>=1.26").unwrap().len(), 2);
        assert!(parse_specs("requests[socks]~=2.31").is_ok());
    }

    #[test]
    fn names_are_normalised() {
        assert_eq!(dist_name("Typing_Extensions>=4"), "typing-extensions");
        let pkgs = vec![Package {
            name: "typing_extensions".into(),
            version: "4.12".into(),
        }];
        assert!(installed_versions("typing-extensions", &pkgs).is_some());
        assert!(installed_versions("typing-extensions six", &pkgs).is_none());
    }
}
