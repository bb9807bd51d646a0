//! Whose sandboxes a call may reach. Ownership lives in the records; every
//! lookup of a sandbox goes through a [`Scope`], so a tenant can never name
//! another tenant's sandbox into existence.

/// One owner's sandboxes, or (an administrator's view) everyone's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    Owner(&'a str),
    Everyone,
}

impl Scope<'_> {
    pub fn admits(&self, owner: &str) -> bool {
        match self {
            Scope::Owner(me) => *me == owner,
            Scope::Everyone => true,
        }
    }
}

impl<'a> From<&'a str> for Scope<'a> {
    fn from(owner: &'a str) -> Self {
        Scope::Owner(owner)
    }
}

impl<'a> From<&'a String> for Scope<'a> {
    fn from(owner: &'a String) -> Self {
        Scope::Owner(owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_scope_admits_only_that_owner() {
        assert!(Scope::Owner("alice").admits("alice"));
        assert!(!Scope::Owner("alice").admits("bob"));
        assert!(!Scope::Owner("alice").admits("alice "));
        assert!(Scope::Everyone.admits("bob"));
    }
}
