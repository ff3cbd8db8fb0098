//! Hostile commits through the Iceberg REST catalog (issue 47): foreign commits whose
//! fields later tiering rounds depend on, and rows other engines append to a log table.
