//! `list_templates`: the prepared environments the caller may create
//! sandboxes from.

use crate::access::caller::Caller;
use crate::ops::results::{ListedTemplate, TemplateList};
use crate::ops::Ops;

impl Ops {
    /// The templates in force that the caller's key (or the guests' tier)
    /// may use, built or with why not.
    pub fn list_templates(&self, caller: &Caller) -> TemplateList {
        let templates = self
            .sandboxes
            .templates()
            .into_iter()
            .filter(|t| self.may_use_template(caller, &t.name))
            .map(ListedTemplate::from)
            .collect();
        TemplateList { templates }
    }
}
