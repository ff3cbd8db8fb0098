"""Fills a stopped server's meta.db with consumer groups' committed offsets, as a
server that has served them for a while would hold (hostile_kafka.rs's test of the
bound on groups with committed offsets): committing them one OffsetCommit at a time
would take minutes of fsyncs.

usage: kafka_committed_groups.py META_DB TOPIC FRESH IDLE_GROUP IDLE_SINCE_MS

FRESH groups (`fresh-0` ...) get an offset in `consumer_offsets` only, as groups that
committed before their activity was recorded: the server's next start records them as
active then. IDLE_GROUP gets an offset and an activity row at IDLE_SINCE_MS.
"""

import sqlite3
import sys


def main() -> None:
    meta_db, topic, fresh, idle_group, idle_since = sys.argv[1:]
    connection = sqlite3.connect(meta_db)
    with connection:
        connection.executemany(
            "INSERT INTO consumer_offsets (group_id, topic, partition, offset, metadata)"
            " VALUES (?, ?, 0, 1, NULL)",
            ((f"fresh-{n}", topic) for n in range(int(fresh))),
        )
        connection.execute(
            "INSERT INTO consumer_offsets (group_id, topic, partition, offset, metadata)"
            " VALUES (?, ?, 0, 1, NULL)",
            (idle_group, topic),
        )
        connection.execute(
            "INSERT INTO consumer_group_activity (group_id, active_at) VALUES (?, ?)",
            (idle_group, int(idle_since)),
        )
    connection.close()


if __name__ == "__main__":
    main()
