-- fencelock MySQL/MariaDB lock table.
--
-- {{TABLE}}, {{TOKENS}}, {{ACQUIRE}} and {{ROTATE}} are replaced by validated,
-- backquoted identifiers (letters, digits and underscores); {{VERSION}} by the
-- version of the procedures. Get the rendered DDL with mysql.Schema(table);
-- the backend runs it itself unless SkipCreate is set. Statements are
-- separated by lines holding only "-- ;;" (the procedures contain ";").

-- One row per key ever locked (until swept). A released or expired row is
-- free: expires_at <= UTC_TIMESTAMP(6) by the server's clock. A release sets
-- expires_at back to locked_at, which no grant or renewal does, so an ended
-- row with expires_at > locked_at ended without a release (lock delay).
-- version grows with every write, so that a write always changes its row
-- and the affected-row count is the matched-row count whatever the
-- connection's CLIENT_FOUND_ROWS flag.
CREATE TABLE IF NOT EXISTS {{TABLE}} (
    lock_key       VARBINARY(512)  NOT NULL,
    owner          VARBINARY(512)  NOT NULL,
    token          BIGINT UNSIGNED NOT NULL,
    locked_at      DATETIME(6)     NOT NULL,
    expires_at     DATETIME(6)     NOT NULL,
    version        BIGINT UNSIGNED NOT NULL DEFAULT 0,
    -- The holder's metadata (at most 4096 bytes) and the owner that stored
    -- it: Inspect and List report it only while metadata_owner is the owner.
    metadata       VARBINARY(4096) NULL,
    metadata_owner VARBINARY(512)  NULL,
    PRIMARY KEY (lock_key)
) ENGINE = InnoDB
-- ;;
-- Fencing tokens come from one counter row per table, drawn with
-- LAST_INSERT_ID(v + 1) in the same transaction as the grant that carries
-- the token: the grant and the counter commit (or roll back) together, so
-- after a crash the counter is at or above every token a surviving grant
-- has, and tokens never go back. Sweeping rows does not touch it.
CREATE TABLE IF NOT EXISTS {{TOKENS}} (
    id TINYINT UNSIGNED NOT NULL,
    v  BIGINT UNSIGNED  NOT NULL,
    PRIMARY KEY (id)
) ENGINE = InnoDB
-- ;;
INSERT IGNORE INTO {{TOKENS}} (id, v) VALUES (1, 0)
-- ;;
DROP PROCEDURE IF EXISTS {{ACQUIRE}}
-- ;;
-- Acquire in one call, one transaction on the server: the key's row is
-- locked (SELECT … FOR UPDATE, READ COMMITTED so that a missing key takes no
-- gap lock) and judged by the server's clock; a free row (ended, and
-- released or past the lock delay p_delay µs), the same owner's expired
-- row, or a missing one is taken with a token drawn from the counter; the
-- same owner's live row keeps its token (a retry); otherwise the answer
-- names the holder. Result: ok, token, owner, remaining µs, lock delay µs.
CREATE PROCEDURE {{ACQUIRE}}(IN p_key VARBINARY(512), IN p_owner VARBINARY(512), IN p_ttl BIGINT,
    IN p_md VARBINARY(4096), IN p_delay BIGINT)
    MODIFIES SQL DATA
    COMMENT 'fencelock {{VERSION}}'
BEGIN
    DECLARE v_found INT DEFAULT 1;
    DECLARE v_owner VARBINARY(512);
    DECLARE v_token BIGINT UNSIGNED;
    DECLARE v_locked, v_expires, v_now DATETIME(6);
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SELECT owner, token, locked_at, expires_at INTO v_owner, v_token, v_locked, v_expires
        FROM {{TABLE}} WHERE lock_key = p_key FOR UPDATE;
    SET v_now = UTC_TIMESTAMP(6);
    IF v_found = 0 THEN
        UPDATE {{TOKENS}} SET v = LAST_INSERT_ID(v + 1) WHERE id = 1;
        SET v_token = LAST_INSERT_ID();
        INSERT INTO {{TABLE}} (lock_key, owner, token, locked_at, expires_at, metadata, metadata_owner)
            VALUES (p_key, p_owner, v_token, v_now, v_now + INTERVAL p_ttl MICROSECOND, p_md, p_owner);
        COMMIT;
        SELECT 1, v_token, p_owner, p_ttl, 0;
    ELSEIF v_owner = p_owner AND v_expires > v_now THEN
        UPDATE {{TABLE}} SET expires_at = v_now + INTERVAL p_ttl MICROSECOND, metadata = p_md,
            metadata_owner = p_owner, version = version + 1 WHERE lock_key = p_key;
        COMMIT;
        SELECT 1, v_token, p_owner, p_ttl, 0;
    ELSEIF v_owner = p_owner OR (v_expires <= v_now AND
            (v_expires = v_locked OR v_expires + INTERVAL p_delay MICROSECOND <= v_now)) THEN
        UPDATE {{TOKENS}} SET v = LAST_INSERT_ID(v + 1) WHERE id = 1;
        SET v_token = LAST_INSERT_ID();
        UPDATE {{TABLE}} SET owner = p_owner, token = v_token, locked_at = v_now,
            expires_at = v_now + INTERVAL p_ttl MICROSECOND, metadata = p_md, metadata_owner = p_owner,
            version = version + 1 WHERE lock_key = p_key;
        COMMIT;
        SELECT 1, v_token, p_owner, p_ttl, 0;
    ELSEIF v_expires <= v_now THEN
        COMMIT;
        SELECT 0, v_token, v_owner, 0, TIMESTAMPDIFF(MICROSECOND, v_now, v_expires + INTERVAL p_delay MICROSECOND);
    ELSE
        COMMIT;
        SELECT 0, v_token, v_owner, TIMESTAMPDIFF(MICROSECOND, v_now, v_expires), 0;
    END IF;
END
-- ;;
DROP PROCEDURE IF EXISTS {{ROTATE}}
-- ;;
-- A renewal that rotates the token: the owner-, token- and expiry-checked
-- row is locked, a token drawn, and both committed together. With p_setmd
-- the metadata is replaced too. Result: the new token, or 0 when the grant
-- is not held.
CREATE PROCEDURE {{ROTATE}}(IN p_key VARBINARY(512), IN p_owner VARBINARY(512), IN p_token BIGINT UNSIGNED,
    IN p_ttl BIGINT, IN p_setmd BOOLEAN, IN p_md VARBINARY(4096))
    MODIFIES SQL DATA
    COMMENT 'fencelock {{VERSION}}'
BEGIN
    DECLARE v_found INT DEFAULT 1;
    DECLARE v_one INT;
    DECLARE v_token BIGINT UNSIGNED;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    SELECT 1 INTO v_one FROM {{TABLE}}
        WHERE lock_key = p_key AND owner = p_owner AND token = p_token AND expires_at > UTC_TIMESTAMP(6) FOR UPDATE;
    IF v_found = 0 THEN
        COMMIT;
        SELECT 0;
    ELSE
        UPDATE {{TOKENS}} SET v = LAST_INSERT_ID(v + 1) WHERE id = 1;
        SET v_token = LAST_INSERT_ID();
        UPDATE {{TABLE}} SET token = v_token, expires_at = UTC_TIMESTAMP(6) + INTERVAL p_ttl MICROSECOND,
            metadata = IF(p_setmd, p_md, metadata), metadata_owner = IF(p_setmd, owner, metadata_owner),
            version = version + 1 WHERE lock_key = p_key;
        COMMIT;
        SELECT v_token;
    END IF;
END
