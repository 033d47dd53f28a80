-- Named queries of the actions trail; the table is in 0019_actions.sql. Newest first, by id
-- (the keyset cursor `before`); one query per index, so each reads about `limit` rows.

-- name: insert_action
INSERT INTO tether_actions (at, actor, via, client, action, subject, outcome, detail)
VALUES (:at, :actor, :via, :client, :action, :subject, :outcome, :detail)
RETURNING id;

-- name: list_actions
SELECT id, at, actor, via, client, action, subject, outcome, detail FROM tether_actions
WHERE id < :before ORDER BY id DESC LIMIT :limit;

-- name: list_actions_of_subject
SELECT id, at, actor, via, client, action, subject, outcome, detail FROM tether_actions
WHERE subject = :subject AND id < :before ORDER BY id DESC LIMIT :limit;

-- name: list_actions_of_actor
SELECT id, at, actor, via, client, action, subject, outcome, detail FROM tether_actions
WHERE actor = :actor AND id < :before ORDER BY id DESC LIMIT :limit;

-- name: list_actions_of_subject_by_actor
SELECT id, at, actor, via, client, action, subject, outcome, detail FROM tether_actions
WHERE subject = :subject AND actor = :actor AND id < :before ORDER BY id DESC LIMIT :limit;
