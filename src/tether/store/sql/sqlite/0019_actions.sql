-- Tether schema v19 for SQLite: the trail of actions people took on runs and messages (cancel,
-- resume, an event sent, a fork, an outbox retry, a sign-in) from the pages, the API or the CLI.

-- Append only: a row is written once, after the action was done or refused, and never changed.
-- id orders the trail (the listing's keyset cursor); subject is a run id, a message id or a
-- user name, as the action says.
CREATE TABLE tether_actions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    at          REAL NOT NULL,
    actor       TEXT NOT NULL,          -- a user's name, or cli:<login>
    via         TEXT NOT NULL,          -- page, api or cli
    client      TEXT NOT NULL,          -- the client's address, or the CLI's host
    action      TEXT NOT NULL,
    subject     TEXT NOT NULL,
    outcome     TEXT NOT NULL,          -- done or refused
    detail      TEXT NOT NULL           -- redacted when written
);

CREATE INDEX tether_actions_subject ON tether_actions (subject, id);
CREATE INDEX tether_actions_actor ON tether_actions (actor, id);
