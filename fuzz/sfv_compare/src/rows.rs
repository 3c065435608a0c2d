//! The inputs of the `ratelimit_table` and `ratelimit_policy_table` rows
//! of `src/parse/rate_limit_headers.rs` (their expected answers are the
//! hand parser's, checked there).

pub fn rows() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vec![
        b"\"default\";r=0;t=10".to_vec(),
        b"\"default\";r=0;t=10, \"burst\";r=5;t=1".to_vec(),
        b"default;r=3;t=4".to_vec(),
        b"\"a\";foo=bar;r=1;x=\"y\";t=2;z=1.5;pk=:AQI=:;b=?0".to_vec(),
        b"\"a\";r=1;flag;t=2".to_vec(),
        b"\"a\";r;t=2".to_vec(),
        b"\"a\"; r=1 ,\t\"b\";t=3".to_vec(),
        b", None, Some(3))]),
            ),
            (
                "
        .to_vec(),
        br#""a\"b\\c";r=1"#.to_vec(),
        b"\"a\";r=1;r=2".to_vec(),
        b"\"a\";r=1;t=1.5".to_vec(),
        b"\"a\";r=\"5\"".to_vec(),
        b"\"a\";r=999999999999999".to_vec(),
        b"\"default;r=0".to_vec(),
        b"\"a\";r=".to_vec(),
        b"\"a\";r=1,".to_vec(),
        b"\"a\";r=-1".to_vec(),
        b"\"a\";r=1234567890123456".to_vec(),
        b"".to_vec(),
        b",\"a\";r=1".to_vec(),
        b"\"a\";r=1,,\"b\";r=2".to_vec(),
        b"\"a\";R=1".to_vec(),
        b"\"a\" ;r=1".to_vec(),
        b"(\"a\" \"b\");r=1".to_vec(),
        b"5;r=1".to_vec(),
        b"limit=100, remaining=50, reset=5".to_vec(),
        "\"d\u{e9}faut\";r=1".as_bytes().to_vec(),
        b"\"a\";t=1.2345".to_vec(),
        b"\"a\";t=1.".to_vec(),
        br#""a\n";r=1"#.to_vec(),
        b"\"a\";r=1;t=2 x".to_vec(),
        b"\"a\";b=?2".to_vec(),
        b"\"a\";b=:A:".to_vec(),
        b"\"default\";q=100;w=60".to_vec(),
        b"\"default\";q=100;w=60, \"daily\";q=1000;w=86400".to_vec(),
        b"permin;q=10".to_vec(),
        b"\"a\";r=1;t=2;q=3".to_vec(),
        b"\"a\";q=1.5;w=60".to_vec(),
        b"\"a\";q=-1".to_vec(),
        b"\"a\";w=".to_vec(),
        b"\"a\";q=1;".to_vec(),
        b"100;w=60".to_vec(),
    ];
    v.push(format!("\"{}\";r=1", "a".repeat(256)).into_bytes());
    v
}
