//! The splitter, dialect by dialect.

use super::*;

fn split(sql: &str) -> Vec<String> {
    split_statements(sql)
}

#[test]
fn plain_statements() {
    assert_eq!(
        split("CREATE TABLE a (id int);\nCREATE TABLE b (id int);\n"),
        vec!["CREATE TABLE a (id int)", "CREATE TABLE b (id int)"]
    );
    assert_eq!(split("SELECT 1"), vec!["SELECT 1"]);
    assert_eq!(
        split("  SELECT 1 ;  ;; SELECT 2;"),
        vec!["SELECT 1", "SELECT 2"]
    );
}

#[test]
fn empty_and_comment_only_inputs_give_nothing() {
    for sql in [
        "",
        ";",
        " ;\n; \t",
        "-- just a note",
        "-- a; b\n/* c; d */ ;",
        "/* /* nested; */ still; */",
        "\u{a0};\u{2003}",
    ] {
        assert!(split(sql).is_empty(), "{sql:?} gave {:?}", split(sql));
    }
}

#[test]
fn semicolon_in_single_quotes() {
    assert_eq!(
        split("INSERT INTO t VALUES ('a;b'); SELECT 'x;'"),
        vec!["INSERT INTO t VALUES ('a;b')", "SELECT 'x;'"]
    );
}

#[test]
fn doubled_quote_escape() {
    assert_eq!(
        split("INSERT INTO t VALUES ('it''s; fine'); SELECT 2"),
        vec!["INSERT INTO t VALUES ('it''s; fine')", "SELECT 2"]
    );
    assert_eq!(
        split("SELECT ''; SELECT ''''"),
        vec!["SELECT ''", "SELECT ''''"]
    );
}

#[test]
fn e_string_backslash_escape() {
    assert_eq!(
        split(r"SELECT E'it\'s; fine'; SELECT 2"),
        vec![r"SELECT E'it\'s; fine'", "SELECT 2"]
    );
    assert_eq!(
        split(r"SELECT e'\\'; SELECT 2"),
        vec![r"SELECT e'\\'", "SELECT 2"]
    );
    // Outside E'' a backslash is an ordinary character in standard SQL.
    assert_eq!(
        split(r"SELECT 'C:\'; SELECT 2"),
        vec![r"SELECT 'C:\'", "SELECT 2"]
    );
    // `name'…'` is no E-string just because the word ends in e.
    assert_eq!(
        split(r"SELECT some'\'; SELECT 2"),
        vec![r"SELECT some'\'", "SELECT 2"]
    );
}

#[test]
fn double_quoted_identifiers() {
    assert_eq!(
        split(r#"CREATE TABLE "a;b" ("x"";y" int); SELECT 1"#),
        vec![r#"CREATE TABLE "a;b" ("x"";y" int)"#, "SELECT 1"]
    );
}

#[test]
fn backtick_identifiers() {
    assert_eq!(
        split("CREATE TABLE `a;b` (`c``;` int); SELECT 1"),
        vec!["CREATE TABLE `a;b` (`c``;` int)", "SELECT 1"]
    );
}

#[test]
fn line_comments_hide_semicolons_and_are_kept() {
    assert_eq!(
        split("SELECT 1 -- not here; really\n+ 1; SELECT 2"),
        vec!["SELECT 1 -- not here; really\n+ 1", "SELECT 2"]
    );
    assert_eq!(
        split("-- header; comment\nSELECT 1;"),
        vec!["-- header; comment\nSELECT 1"]
    );
    assert_eq!(
        split("SELECT 1 --;\r; SELECT 2"),
        vec!["SELECT 1 --;", "SELECT 2"]
    );
}

#[test]
fn hash_is_not_a_comment_by_default() {
    assert_eq!(
        split("SELECT 1 # x; SELECT 2"),
        vec!["SELECT 1 # x", "SELECT 2"]
    );
}

#[test]
fn nested_block_comments() {
    assert_eq!(
        split("SELECT /* a /* b; */ c; */ 1; SELECT 2"),
        vec!["SELECT /* a /* b; */ c; */ 1", "SELECT 2"]
    );
    assert_eq!(split("SELECT /*/ ; */ 1;"), vec!["SELECT /*/ ; */ 1"]);
    assert_eq!(
        split("SELECT /**/ 1; SELECT 2"),
        vec!["SELECT /**/ 1", "SELECT 2"]
    );
}

#[test]
fn dollar_quoted_bodies() {
    let f = "CREATE FUNCTION f() RETURNS int AS $$ BEGIN RETURN 1; END; $$ LANGUAGE plpgsql";
    assert_eq!(split(&format!("{f}; SELECT 2;")), vec![f, "SELECT 2"]);

    let g = "CREATE FUNCTION g() RETURNS text AS $fn$ SELECT '$$;'; $$ ; $fn$ LANGUAGE sql";
    assert_eq!(split(&format!("{g};SELECT 3")), vec![g, "SELECT 3"]);

    let h = "DO $body_1$ BEGIN PERFORM 1; END $body_1$";
    assert_eq!(split(&format!("{h};{h}")), vec![h, h]);

    // A different tag does not close the body.
    let k = "SELECT $a$ x; $b$ y; $a$";
    assert_eq!(split(&format!("{k}; SELECT 1")), vec![k, "SELECT 1"]);
}

#[test]
fn positional_parameters_are_not_dollar_quotes() {
    assert_eq!(
        split("PREPARE p AS SELECT $1; EXECUTE p(1); SELECT $2, $3"),
        vec!["PREPARE p AS SELECT $1", "EXECUTE p(1)", "SELECT $2, $3"]
    );
    assert_eq!(
        split("SELECT $1$; SELECT 2"),
        vec!["SELECT $1$", "SELECT 2"]
    );
    // `a$$` continues an identifier in PostgreSQL.
    assert_eq!(
        split("SELECT a$$; SELECT 2"),
        vec!["SELECT a$$", "SELECT 2"]
    );
    assert_eq!(split("SELECT $; SELECT 2"), vec!["SELECT $", "SELECT 2"]);
}

#[test]
fn unterminated_regions_swallow_the_rest() {
    assert_eq!(
        split("SELECT 1; SELECT 'oops; SELECT 2"),
        vec!["SELECT 1", "SELECT 'oops; SELECT 2"]
    );
    assert_eq!(
        split("SELECT 1; SELECT \"x; y"),
        vec!["SELECT 1", "SELECT \"x; y"]
    );
    assert_eq!(
        split("SELECT 1; SELECT `x; y"),
        vec!["SELECT 1", "SELECT `x; y"]
    );
    assert_eq!(split("SELECT 1; /* a; b"), vec!["SELECT 1"]);
    assert_eq!(
        split("SELECT 1; SELECT /* a; b"),
        vec!["SELECT 1", "SELECT /* a; b"]
    );
    assert_eq!(
        split("SELECT 1; DO $x$ a; b"),
        vec!["SELECT 1", "DO $x$ a; b"]
    );
    assert_eq!(split(r"SELECT E'\"), vec![r"SELECT E'\"]);
    assert_eq!(split("SELECT '"), vec!["SELECT '"]);
}

#[test]
fn non_ascii_text_is_never_cut() {
    let sql = "INSERT INTO t VALUES ('héllo; wörld');SELECT '日本;語';SELECT $é$ x;y $é$";
    assert_eq!(
        split(sql),
        vec![
            "INSERT INTO t VALUES ('héllo; wörld')",
            "SELECT '日本;語'",
            "SELECT $é$ x;y $é$"
        ]
    );
}

#[test]
fn unicode_whitespace_is_whitespace_to_the_lexer_as_to_trim() {
    // The statement is trimmed to `$$…$$` before the engine gets it, so the splitter must
    // not take `\u{a0}$$` for one word and cut the body in two.
    let sql = "SELECT 1;\u{a0}$$ a; b $$;\u{2003}E'x\\'; y'";
    let want = vec!["SELECT 1", "$$ a; b $$", "E'x\\'; y'"];
    assert_eq!(split(sql), want);
    assert_eq!(split(&want.join("\n;\n")), want);
    assert_eq!(
        split("SELECT\u{a0}$$ a; b $$"),
        vec!["SELECT\u{a0}$$ a; b $$"]
    );
    // In MySQL `--` then U+0085 is a comment, as the trimmed `--` would be.
    let my = |sql| split_statements_in(sql, Dialect::MySql);
    assert_eq!(
        my("SELECT 1 --\u{85}; x\n; SELECT 2"),
        vec!["SELECT 1 --\u{85}; x", "SELECT 2"]
    );
    assert!(my("--\u{a0};").is_empty());
    // Other non-ASCII text still continues a word.
    assert_eq!(
        split("SELECT é$$; SELECT 2"),
        vec!["SELECT é$$", "SELECT 2"]
    );
}

#[test]
fn mysql_executable_comments_are_statements() {
    assert_eq!(
        split("/*!40101 SET NAMES utf8mb4 */;\n/* plain; */;\nSELECT 1;"),
        vec!["/*!40101 SET NAMES utf8mb4 */", "SELECT 1"]
    );
}

#[test]
fn mysql_dialect() {
    let my = |sql| split_statements_in(sql, Dialect::MySql);
    assert_eq!(
        my(r"INSERT INTO t VALUES ('it\'s; fine', 'a\\'); SELECT 2"),
        vec![r"INSERT INTO t VALUES ('it\'s; fine', 'a\\')", "SELECT 2"]
    );
    assert_eq!(
        my(r#"SELECT "a\"; b"; SELECT 2"#),
        vec![r#"SELECT "a\"; b""#, "SELECT 2"]
    );
    assert_eq!(
        my("SELECT 1 # don't; x\n; SELECT 2"),
        vec!["SELECT 1 # don't; x", "SELECT 2"]
    );
    // `--1` is minus minus one in MySQL, not a comment.
    assert_eq!(my("SELECT 5--1; SELECT 2"), vec!["SELECT 5--1", "SELECT 2"]);
    assert_eq!(
        my("SELECT 5-- 1; x\n; SELECT 2"),
        vec!["SELECT 5-- 1; x", "SELECT 2"]
    );
    assert_eq!(my("SELECT 5--"), vec!["SELECT 5--"]);
    // Not nested: the first `*/` ends the comment.
    assert_eq!(
        my("SELECT /* /* */ 1; SELECT 2"),
        vec!["SELECT /* /* */ 1", "SELECT 2"]
    );
    // No dollar quotes.
    assert_eq!(my("SELECT $$; SELECT $$"), vec!["SELECT $$", "SELECT $$"]);
}

#[test]
fn clickhouse_dialect() {
    let ch = |sql| split_statements_in(sql, Dialect::ClickHouse);
    assert_eq!(
        ch(r"INSERT INTO t VALUES ('it\'s; fine'); SELECT 2"),
        vec![r"INSERT INTO t VALUES ('it\'s; fine')", "SELECT 2"]
    );
    assert_eq!(
        ch("SELECT $h$ a; b $h$; SELECT 2"),
        vec!["SELECT $h$ a; b $h$", "SELECT 2"]
    );
    assert_eq!(
        ch("SELECT 1 # x; SELECT 2"),
        vec!["SELECT 1 # x", "SELECT 2"]
    );
}

fn pg(sql: &str) -> Vec<String> {
    split_statements_in(sql, Dialect::Postgres)
}

fn lite(sql: &str) -> Vec<String> {
    split_statements_in(sql, Dialect::Sqlite)
}

fn my(sql: &str) -> Vec<String> {
    split_statements_in(sql, Dialect::MySql)
}

#[test]
fn postgres_begin_atomic_bodies_are_one_statement() {
    let f = "CREATE FUNCTION add(a int, b int) RETURNS int LANGUAGE sql IMMUTABLE\n\
             BEGIN ATOMIC\n  SELECT a + b;\nEND";
    assert_eq!(pg(&format!("{f};\nSELECT 1;")), vec![f, "SELECT 1"]);

    let p = "create or replace procedure log_it(msg text) language sql begin atomic\n\
             insert into log values (msg);\n\
             insert into log values (case when msg = '' then 'empty' else msg end);\n\
             select case 1 when 1 then 2 end;\nend";
    assert_eq!(
        pg(&format!("{p};\ncreate table x (id int);")),
        vec![p, "create table x (id int)"]
    );
}

#[test]
fn postgres_begin_outside_a_routine_is_a_transaction() {
    assert_eq!(
        pg("BEGIN;\nCREATE TABLE a (id int);\nCOMMIT;"),
        vec!["BEGIN", "CREATE TABLE a (id int)", "COMMIT"]
    );
    // A routine with a quoted body counts nothing inside the quotes.
    let f = "CREATE FUNCTION f() RETURNS trigger AS $$ BEGIN NEW.at := now(); RETURN NEW; END; $$ LANGUAGE plpgsql";
    assert_eq!(pg(&format!("{f};BEGIN;END;")), vec![f, "BEGIN", "END"]);
}

#[test]
fn postgres_parenthesised_rule_actions_are_one_statement() {
    let r = "CREATE RULE log_insert AS ON INSERT TO items DO ALSO (\n\
             INSERT INTO audit VALUES ('a');\n INSERT INTO audit VALUES ('b')\n)";
    assert_eq!(pg(&format!("{r};\nSELECT 1;")), vec![r, "SELECT 1"]);
}

#[test]
fn sqlite_triggers_end_at_semicolon_end_semicolon() {
    let t = "CREATE TRIGGER touch AFTER UPDATE ON users FOR EACH ROW\n\
             BEGIN\n  UPDATE users SET updated_at = CURRENT_TIMESTAMP WHERE id = NEW.id;\n\
             UPDATE stats SET n = CASE WHEN n IS NULL THEN 1 ELSE n + 1 END;\nEND";
    assert_eq!(
        lite(&format!("{t};\nCREATE TABLE x (id int);")),
        vec![t, "CREATE TABLE x (id int)"]
    );
    let temp = "create temp trigger if not exists t2 before insert on a begin select raise(abort, 'no; way'); end";
    assert_eq!(lite(&format!("{temp};select 1")), vec![temp, "select 1"]);
    // Comments between `;`, `END` and `;` change nothing.
    let c = "CREATE TRIGGER c AFTER INSERT ON a BEGIN DELETE FROM b; /* x */ END -- y\n";
    assert_eq!(lite(&format!("{c};SELECT 2;")), vec![c.trim(), "SELECT 2"]);
}

#[test]
fn sqlite_bracket_identifiers_and_plain_comments() {
    assert_eq!(
        lite("CREATE TABLE [a;b] ([c;] int); SELECT 1"),
        vec!["CREATE TABLE [a;b] ([c;] int)", "SELECT 1"]
    );
    // SQLite block comments do not nest, and `$$` quotes nothing.
    assert_eq!(
        lite("SELECT /* /* */ 1; SELECT '$$'; SELECT $$"),
        vec!["SELECT /* /* */ 1", "SELECT '$$'", "SELECT $$"]
    );
}

#[test]
fn mysql_trigger_and_procedure_bodies_are_one_statement() {
    let t = "CREATE TRIGGER users_bi BEFORE INSERT ON users FOR EACH ROW\nBEGIN\n\
             IF NEW.email IS NULL THEN\n    SET NEW.email = '';\n  ELSEIF NEW.email = 'x' THEN\n\
             SET NEW.email = 'y';\n  ELSE\n    SET NEW.flag = IF(NEW.a > 1, 1, 0);\n  END IF;\n\
             SET NEW.kind = CASE WHEN NEW.a > 0 THEN 'p' ELSE 'n' END;\nEND";
    assert_eq!(
        my(&format!("{t};\nCREATE TABLE x (id int);")),
        vec![t, "CREATE TABLE x (id int)"]
    );
    let p = "CREATE DEFINER=`root`@`localhost` PROCEDURE fill(IN n INT)\nBEGIN\n\
             DECLARE i INT DEFAULT 0;\n  DECLARE done INT DEFAULT 0;\n\
             DECLARE CONTINUE HANDLER FOR SQLEXCEPTION BEGIN SET done = 1; END;\n\
             fill_loop: LOOP\n    SET i = i + 1;\n    IF i > n THEN LEAVE fill_loop; END IF;\n\
             INSERT INTO t VALUES (i);\n  END LOOP fill_loop;\n  WHILE i > 0 DO SET i = i - 1; END WHILE;\n\
             REPEAT SET i = i + 1; UNTIL i >= 3 END REPEAT;\n\
             CASE i WHEN 3 THEN SELECT 'three'; ELSE BEGIN END; END CASE;\nEND";
    assert_eq!(my(&format!("{p};\nCALL fill(3);")), vec![p, "CALL fill(3)"]);
    let f = "CREATE FUNCTION double_it(x INT) RETURNS INT DETERMINISTIC RETURN x * 2";
    assert_eq!(my(&format!("{f};SELECT 1;")), vec![f, "SELECT 1"]);
    let e = "CREATE EVENT purge ON SCHEDULE EVERY 1 DAY DO BEGIN DELETE FROM a; DELETE FROM b; END";
    assert_eq!(my(&format!("{e};SELECT 1")), vec![e, "SELECT 1"]);
    // A trigger whose body is an IF statement without BEGIN.
    let i =
        "CREATE TRIGGER t BEFORE INSERT ON a FOR EACH ROW IF NEW.x < 0 THEN SET NEW.x = 0; END IF";
    assert_eq!(my(&format!("{i};SELECT 1")), vec![i, "SELECT 1"]);
}

#[test]
fn mysql_mariadb_compound_statements_outside_programs() {
    let b = "BEGIN NOT ATOMIC\n  DECLARE x INT DEFAULT 1;\n  IF x THEN SELECT 1; END IF;\nEND";
    assert_eq!(my(&format!("{b};SELECT 2;")), vec![b, "SELECT 2"]);
    let i = "IF (SELECT COUNT(*) FROM t) = 0 THEN INSERT INTO t VALUES (1); END IF";
    assert_eq!(my(&format!("{i};SELECT 2;")), vec![i, "SELECT 2"]);
    // A plain BEGIN is a transaction.
    assert_eq!(
        my("BEGIN;\nINSERT INTO t VALUES (1);\nCOMMIT;"),
        vec!["BEGIN", "INSERT INTO t VALUES (1)", "COMMIT"]
    );
    assert_eq!(my("BEGIN WORK; COMMIT"), vec!["BEGIN WORK", "COMMIT"]);
}

#[test]
fn mysql_words_that_only_look_like_blocks() {
    // `event`, `begin` and `end` as names, CASE expressions and IF() outside programs.
    assert_eq!(
        my(
            "CREATE TABLE event (`begin` int, end_at int); SELECT CASE WHEN 1 THEN 2 END; SELECT IF(1, 2, 3);"
        ),
        vec![
            "CREATE TABLE event (`begin` int, end_at int)",
            "SELECT CASE WHEN 1 THEN 2 END",
            "SELECT IF(1, 2, 3)"
        ]
    );
    assert_eq!(
        my("CREATE OR REPLACE VIEW v AS SELECT 1; DROP PROCEDURE IF EXISTS p; SELECT 2"),
        vec![
            "CREATE OR REPLACE VIEW v AS SELECT 1",
            "DROP PROCEDURE IF EXISTS p",
            "SELECT 2"
        ]
    );
}

#[test]
fn mysql_delimiter_commands() {
    let sql = "DROP PROCEDURE IF EXISTS p;\nDELIMITER $$\nCREATE PROCEDURE p()\nBEGIN\n  SELECT 'a;b';\n  SELECT 2;\nEND$$\nDELIMITER ;\nCALL p();\n";
    assert_eq!(
        my(sql),
        vec![
            "DROP PROCEDURE IF EXISTS p",
            "CREATE PROCEDURE p()\nBEGIN\n  SELECT 'a;b';\n  SELECT 2;\nEND",
            "CALL p()"
        ]
    );
    // Any string, any case; statements between delimiters are sent as they are.
    let sql = "delimiter //\nCREATE TRIGGER t BEFORE INSERT ON a FOR EACH ROW SET NEW.x = 1//\nSELECT 1; SELECT 2 //\ndelimiter ;\nSELECT 3;";
    assert_eq!(
        my(sql),
        vec![
            "CREATE TRIGGER t BEFORE INSERT ON a FOR EACH ROW SET NEW.x = 1",
            "SELECT 1; SELECT 2",
            "SELECT 3"
        ]
    );
    // The delimiter inside a string or comment is text.
    assert_eq!(
        my("DELIMITER ;;\nSELECT ';;' /* ;; */;;\nDELIMITER ;\n"),
        vec!["SELECT ';;' /* ;; */"]
    );
    // Not a command: inside a statement, or not at the start of a line.
    assert_eq!(
        my("SELECT 1 AS delimiter; SELECT 2"),
        vec!["SELECT 1 AS delimiter", "SELECT 2"]
    );
    // Other dialects have no DELIMITER command.
    assert_eq!(
        pg("DELIMITER //\nSELECT 1;"),
        vec!["DELIMITER //\nSELECT 1"]
    );
}

#[test]
fn mariadb_executable_comments_are_code() {
    assert_eq!(
        my("/*M!100100 SET x = 1 */;\n/*!40101 SET NAMES utf8 */;\n/* plain */;"),
        vec!["/*M!100100 SET x = 1 */", "/*!40101 SET NAMES utf8 */"]
    );
}

#[test]
fn mysql_names_that_are_keywords_do_not_open_or_close_blocks() {
    let t = "CREATE TRIGGER t BEFORE INSERT ON slots FOR EACH ROW BEGIN\n  SET NEW.end = NEW.start + INTERVAL 1 HOUR;\n  SET NEW.begin = NEW.start;\n  SET NEW.x = 1;\nEND";
    assert_eq!(my(&format!("{t};\nSELECT 1;")), vec![t, "SELECT 1"]);
    let h = "CREATE PROCEDURE p() BEGIN\n  DECLARE done INT DEFAULT 0;\n  DECLARE CONTINUE HANDLER FOR NOT FOUND IF done = 0 THEN SET done = 1; END IF;\n  SELECT 1;\nEND";
    assert_eq!(my(&format!("{h};\nSELECT 2;")), vec![h, "SELECT 2"]);
    let e = "ALTER EVENT purge DO BEGIN DELETE FROM a; DELETE FROM b; END";
    assert_eq!(my(&format!("{e};SELECT 3")), vec![e, "SELECT 3"]);
    let r = "CREATE PROCEDURE r() BEGIN DECLARE i INT DEFAULT 0; REPEAT SET i = i + 1; UNTIL i > 3 END REPEAT; SELECT CASE WHEN i > 0 THEN 1 ELSE 0 END AS x; END";
    assert_eq!(my(&format!("{r};SELECT 4")), vec![r, "SELECT 4"]);
}
