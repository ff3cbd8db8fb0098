//! Hostile requests to `mink worker` (issue 47): plans whose payloads would make the
//! worker allocate without bound, and a task cache that a client could grow.
