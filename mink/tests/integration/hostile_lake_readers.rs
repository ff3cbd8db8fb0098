//! Lake upkeep under running readers (issue 47): expiry and orphan removal never delete
//! a file a running statement planned on, and the orphan grace protects in-flight commits.
