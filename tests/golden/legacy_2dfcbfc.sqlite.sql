BEGIN TRANSACTION;
CREATE TABLE tether_approval_audit (
    approval_id TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    at          REAL NOT NULL,
    event       TEXT NOT NULL,
    actor       TEXT,
    detail      TEXT NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL,
    PRIMARY KEY (approval_id, seq)
) WITHOUT ROWID;
CREATE TABLE tether_approvals (
    id          TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL,
    step        TEXT NOT NULL,
    status      TEXT NOT NULL,
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    audit_count INTEGER NOT NULL,
    audit_head  TEXT NOT NULL,
    body        TEXT NOT NULL
);
CREATE TABLE tether_checkpoints (
    run_id      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    name        TEXT NOT NULL,
    kind        TEXT NOT NULL,
    status      TEXT NOT NULL,
    result      TEXT,
    error       TEXT,
    attempts    INTEGER NOT NULL DEFAULT 0,
    started_at  REAL,
    finished_at REAL,
    retry_at    REAL, position TEXT, args TEXT,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
INSERT INTO "tether_checkpoints" VALUES('legacy-done',0,'add','step','completed','15',NULL,1,1.79618171856397747989e+09,1.796181718563996315e+09,NULL,'0','{"args":[5,10],"kwargs":{}}');
INSERT INTO "tether_checkpoints" VALUES('legacy-early-event',0,'add','step','completed','101',NULL,1,1.7961817206130862236e+09,1.79618172061311197275e+09,NULL,'0','{"args":[100,1],"kwargs":{}}');
INSERT INTO "tether_checkpoints" VALUES('legacy-early-event',1,'add#2','step','completed','103',NULL,1,1.79618172061412453648e+09,1.79618172061413478848e+09,NULL,'1','{"args":[101,2],"kwargs":{}}');
INSERT INTO "tether_checkpoints" VALUES('legacy-early-event',2,'event:go','event','completed','{"key":"go","value":7}',NULL,1,1.79618172061521339409e+09,1796181720.91461,NULL,'2',NULL);
INSERT INTO "tether_checkpoints" VALUES('legacy-early-event',3,'add#3','step','completed','110',NULL,1,1.7961817209154479504e+09,1.79618172091547322272e+09,NULL,'3','{"args":[103,7],"kwargs":{}}');
INSERT INTO "tether_checkpoints" VALUES('legacy-waiting',0,'add','step','completed','2',NULL,1,1.79618171856605196006e+09,1.79618171856606531145e+09,NULL,'0','{"args":[1,1],"kwargs":{}}');
INSERT INTO "tether_checkpoints" VALUES('legacy-waiting',1,'add#2','step','completed','4',NULL,1,1.796181718566587925e+09,1.79618171856659936905e+09,NULL,'1','{"args":[2,2],"kwargs":{}}');
INSERT INTO "tether_checkpoints" VALUES('legacy-waiting',2,'event:go','event','started',NULL,NULL,1,1.79618171856696105001e+09,NULL,1.82771771856696105002e+09,'2',NULL);
CREATE TABLE tether_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      TEXT NOT NULL,
    key         TEXT NOT NULL,
    payload     TEXT NOT NULL,
    created_at  REAL NOT NULL,
    consumed_by TEXT,
    consumed_at REAL
);
INSERT INTO "tether_events" VALUES(1,'legacy-early-event','go','7',1.79618172091365814208e+09,'event:go',1.79618172091463756566e+09);
CREATE TABLE tether_forks (
    run_id        TEXT PRIMARY KEY,
    source_run_id TEXT NOT NULL,
    from_step     TEXT NOT NULL,
    from_seq      INTEGER NOT NULL,
    created_at    REAL NOT NULL
);
CREATE TABLE tether_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL);
INSERT INTO "tether_migrations" VALUES(1,1.79618171855498838422e+09);
INSERT INTO "tether_migrations" VALUES(2,1.79618171855498838422e+09);
INSERT INTO "tether_migrations" VALUES(3,1.79618171855599427218e+09);
INSERT INTO "tether_migrations" VALUES(4,1.79618171855599427218e+09);
INSERT INTO "tether_migrations" VALUES(5,1.79618171855599427218e+09);
INSERT INTO "tether_migrations" VALUES(6,1.79618171855599427218e+09);
INSERT INTO "tether_migrations" VALUES(7,1.79618171855700016026e+09);
INSERT INTO "tether_migrations" VALUES(8,1.79618171855700016026e+09);
INSERT INTO "tether_migrations" VALUES(9,1.79618171855700016026e+09);
INSERT INTO "tether_migrations" VALUES(10,1.79618171855700016026e+09);
INSERT INTO "tether_migrations" VALUES(11,1.79618171855700016026e+09);
INSERT INTO "tether_migrations" VALUES(12,1.79618171855800604821e+09);
CREATE TABLE tether_outbox (
    id           TEXT PRIMARY KEY,
    run_id       TEXT NOT NULL,
    checkpoint   TEXT NOT NULL,
    destination  TEXT NOT NULL,
    key          TEXT NOT NULL,
    payload      TEXT NOT NULL,
    status       TEXT NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    uncertain    INTEGER NOT NULL DEFAULT 0,
    in_doubt     INTEGER NOT NULL DEFAULT 0,
    claims       INTEGER NOT NULL DEFAULT 0,
    claimed_by   TEXT,
    next_at      REAL NOT NULL,
    error        TEXT,
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    delivered_at REAL
);
CREATE TABLE tether_runs (
    id               TEXT PRIMARY KEY,
    workflow         TEXT NOT NULL,
    status           TEXT NOT NULL,
    args             TEXT NOT NULL,
    result           TEXT,
    error            TEXT,
    owner            TEXT,
    epoch            INTEGER NOT NULL DEFAULT 0,
    lease_expires_at REAL,
    wake_at          REAL,
    deadline_at      REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    finished_at      REAL
, parent_id TEXT, wake_on TEXT, queue TEXT, priority INTEGER NOT NULL DEFAULT 0, dedup_key TEXT, started_at REAL, started_by TEXT, failures INTEGER NOT NULL DEFAULT 0);
INSERT INTO "tether_runs" VALUES('legacy-done','finished','succeeded','{"args":[5],"kwargs":{}}','15',NULL,NULL,1,NULL,NULL,NULL,0,1.7961817185611181259e+09,1.79618171856497740746e+09,1.79618171856497740746e+09,NULL,NULL,NULL,0,NULL,1.7961817185611181259e+09,NULL,0);
INSERT INTO "tether_runs" VALUES('legacy-waiting','legacy','waiting','{"args":[1],"kwargs":{}}',NULL,NULL,NULL,1,NULL,1.82771771856696105002e+09,NULL,0,1.79618171856561064715e+09,1.79618172056750893591e+09,NULL,NULL,'["go"]',NULL,0,NULL,1.79618171856561064715e+09,NULL,0);
INSERT INTO "tether_runs" VALUES('legacy-early-event','legacy','succeeded','{"args":[100],"kwargs":{}}','110',NULL,NULL,1,NULL,NULL,NULL,0,1.79618172061158156392e+09,1.79618172091578698163e+09,1.79618172091578698163e+09,NULL,NULL,NULL,0,NULL,1.79618172061158156392e+09,NULL,0);
CREATE TABLE tether_schedules (
    name        TEXT PRIMARY KEY,
    workflow    TEXT NOT NULL,
    cron        TEXT NOT NULL,
    tz          TEXT NOT NULL,
    catch_up    TEXT NOT NULL,
    last_slot   REAL NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL
);
CREATE TABLE tether_stream_entries (
    run_id     TEXT NOT NULL,
    key        TEXT NOT NULL,
    "offset"   INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    data       TEXT NOT NULL,
    writer     TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    ref        TEXT,
    created_at REAL NOT NULL,
    PRIMARY KEY (run_id, key, "offset")
) WITHOUT ROWID;
CREATE TABLE tether_users (
    name        TEXT PRIMARY KEY,
    groups      TEXT NOT NULL,          -- JSON list of group names
    token_hash  TEXT NOT NULL UNIQUE,   -- sha256 hex of the bearer token
    created_at  REAL NOT NULL,
    revoked_at  REAL
);
CREATE TABLE tether_values (
    run_id     TEXT NOT NULL,
    key        TEXT NOT NULL,
    version    INTEGER NOT NULL,
    value      TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (run_id, key, version)
) WITHOUT ROWID;
CREATE TABLE tether_workers (
    id           TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER NOT NULL,
    pid_token    TEXT NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL
, workflows TEXT, boot_id TEXT, pid_ns TEXT);
CREATE INDEX tether_runs_due ON tether_runs (status, wake_at);
CREATE INDEX tether_runs_lease ON tether_runs (status, lease_expires_at);
CREATE INDEX tether_runs_created ON tether_runs (created_at);
CREATE INDEX tether_runs_owner ON tether_runs (owner) WHERE owner IS NOT NULL;
CREATE INDEX tether_events_mailbox ON tether_events (run_id, key, id) WHERE consumed_by IS NULL;
CREATE INDEX tether_runs_parent ON tether_runs (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX tether_runs_queue ON tether_runs (queue, status) WHERE queue IS NOT NULL;
CREATE INDEX tether_approvals_status ON tether_approvals (status, created_at);
CREATE INDEX tether_approvals_run ON tether_approvals (run_id);
CREATE UNIQUE INDEX tether_stream_refs ON tether_stream_entries (run_id, key, ref)
    WHERE ref IS NOT NULL;
CREATE INDEX tether_stream_writers ON tether_stream_entries (run_id, key, writer);
CREATE INDEX tether_outbox_due ON tether_outbox (status, next_at);
CREATE INDEX tether_outbox_run ON tether_outbox (run_id);
CREATE INDEX tether_forks_source ON tether_forks (source_run_id, created_at);
CREATE INDEX tether_runs_finished ON tether_runs (finished_at, id) WHERE finished_at IS NOT NULL;
CREATE INDEX tether_events_run ON tether_events (run_id);
CREATE INDEX tether_approvals_updated ON tether_approvals (updated_at, id);
CREATE UNIQUE INDEX tether_runs_dedup ON tether_runs (coalesce(queue, ''), dedup_key)
    WHERE dedup_key IS NOT NULL AND status IN ('pending', 'running', 'waiting', 'held');
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('tether_events',1);
COMMIT;
