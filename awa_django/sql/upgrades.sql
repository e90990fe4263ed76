-- Changes to the tables since the settled schema was first written (before 0.1.0), for a
-- database whose tables an earlier development version created: on one that tables.sql created,
-- each statement does nothing. Folded into tables.sql, and this file emptied, at the release.

-- A callback extension that arrives before the attempt parks is kept for its wait.
ALTER TABLE awa.attempt_state ADD COLUMN IF NOT EXISTS callback_extend_to timestamptz;
