//! Buffers a client makes the server hold (issue 47): prepared-statement parameters and
//! the like are reserved in the SQL memory pool.
