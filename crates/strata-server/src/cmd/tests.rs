//! Tests of the command table against its documentation and `COMMAND`: they read the
//! table itself, which only files above it may name.

mod docs_table {
    use bytes::Bytes;
    use strata_resp::Reply;

    use crate::cmd::ctx::CONTAINER;
    use crate::cmd::docs::*;
    use crate::cmd::syntax;
    use crate::cmd::{COMMANDS, TABLE};

    #[test]
    fn every_command_has_a_summary_and_every_summary_a_command() {
        for s in COMMANDS {
            assert!(
                doc(s.name).is_some_and(|(_, t)| !t.is_empty()),
                "{} has no summary",
                s.name
            );
        }
        for (name, _, _) in DOCS {
            assert!(
                COMMANDS.iter().any(|s| s.name == *name),
                "{name} is not a command"
            );
        }
        assert_eq!(DOCS.len(), COMMANDS.len(), "a command documented twice");
    }

    #[test]
    fn every_syntax_parses_and_takes_the_words_its_arity_allows() {
        let mut wrong = Vec::new();
        for s in COMMANDS {
            let (line, _) = doc(s.name).unwrap();
            let args = syntax::parse(line).unwrap_or_else(|e| panic!("{}: {e}", s.name));
            let (lo, hi) = words(line);
            let (lo, hi) = (lo + 1, hi.map(|h| h + 1));
            // A container is documented by its subcommands (below).
            if subcommands(s.name).next().is_some() {
                assert!(args.is_empty(), "{} is documented by subcommand", s.name);
                continue;
            }
            let fits = if s.arity > 0 {
                (lo, hi) == (s.arity as usize, Some(s.arity as usize))
            } else {
                // (`QUIT` takes anything after it and documents nothing, as in Redis.)
                lo == (-s.arity) as usize && (hi != Some(lo) || args.is_empty())
            };
            if !fits {
                wrong.push(format!(
                    "{} (arity {}): '{line}' takes {lo} to {hi:?}",
                    s.name, s.arity
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn every_subcommand_belongs_to_a_command_parses_and_is_listed_once() {
        let mut seen = std::collections::HashSet::new();
        for (full, _, line, summary) in SUBCOMMANDS {
            let (c, _) = full.split_once('|').expect("command|subcommand");
            let s = COMMANDS.iter().find(|s| s.name == c);
            let s = s.unwrap_or_else(|| panic!("{c} is not a command"));
            assert!(s.arity < 0, "{c} takes no subcommand");
            assert!(!summary.is_empty(), "{full} has no summary");
            syntax::parse(line).unwrap_or_else(|e| panic!("{full}: {e}"));
            assert!(seen.insert(full), "{full} is listed twice");
            assert_eq!(
                subcommand(full.to_uppercase().as_bytes()).unwrap().name,
                *full
            );
        }
    }

    #[test]
    fn containers_are_flagged_and_subcommand_arities_follow_their_syntax() {
        for s in COMMANDS {
            let has = subcommands(s.name).next().is_some();
            assert_eq!(s.flags & CONTAINER != 0, has, "{}", s.name);
        }
        let arity = |n: &[u8]| subcommand(n).unwrap().arity();
        // As redis-server 7.0.15's COMMAND INFO gives them.
        assert_eq!(arity(b"client|id"), 2);
        assert_eq!(arity(b"CLIENT|SETNAME"), 3);
        assert_eq!(arity(b"client|kill"), -3);
        assert_eq!(arity(b"config|set"), -4);
        assert_eq!(arity(b"command|getkeys"), -4);
        assert_eq!(arity(b"memory|usage"), -3);
        assert!(subcommand(b"client|nosuch").is_none() && subcommand(b"client").is_none());
    }

    #[test]
    fn a_container_lists_its_subcommands_and_takes_no_arguments_itself() {
        let Reply::Map(entries) = docs(&TABLE, &[Bytes::from_static(b"CLIENT")]) else {
            panic!("a map")
        };
        let Reply::Map(fields) = &entries[0].1 else {
            panic!("a map")
        };
        let field = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| *k == Reply::bulk(name.to_owned()))
        };
        assert!(field("arguments").is_none(), "{fields:?}");
        let Some((_, Reply::Map(subs))) = field("subcommands") else {
            panic!("no map of subcommands: {fields:?}")
        };
        let names: Vec<&Reply> = subs.iter().map(|(k, _)| k).collect();
        assert!(names.contains(&&Reply::bulk("client|setname")), "{names:?}");
        assert_eq!(names.len(), subcommands("client").count());
    }
}

mod command_table {
    use bytes::Bytes;
    use strata_resp::Reply;

    use crate::cmd::ctx::Spec;
    use crate::cmd::server::*;
    use crate::cmd::{COMMANDS, TABLE};

    fn spec(name: &str) -> &'static Spec {
        COMMANDS.iter().find(|s| s.name == name).expect("a command")
    }

    fn words(ws: &[&str]) -> Vec<Bytes> {
        ws.iter().map(|w| Bytes::from(w.to_string())).collect()
    }

    fn listed(filter: &[&str]) -> Vec<String> {
        match command_list(&TABLE, &words(filter)) {
            Reply::Array(names) => names
                .into_iter()
                .map(|n| match n {
                    Reply::Bulk(b) => String::from_utf8(b.to_vec()).unwrap(),
                    other => panic!("{other:?}"),
                })
                .collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn categories_follow_flags_and_group_and_containers_are_only_slow() {
        let cats = |n: &str| acl_categories(spec(n)).collect::<Vec<_>>();
        assert_eq!(cats("get"), ["read", "string", "fast"]);
        assert_eq!(cats("hset"), ["write", "hash", "fast"]);
        assert_eq!(cats("blpop"), ["write", "list", "slow", "blocking"]);
        assert_eq!(cats("del"), ["keyspace", "write", "slow"]);
        assert_eq!(cats("eval"), ["slow", "scripting"]);
        assert_eq!(cats("config"), ["slow"]);
        assert_eq!(cats("multi"), ["fast", "transaction"]);
    }

    #[test]
    fn command_list_names_subcommands_and_filters_them() {
        let all = listed(&[]);
        assert!(all.contains(&"get".to_string()) && all.contains(&"client|kill".to_string()));
        assert_eq!(
            all.len(),
            COMMANDS.len() + crate::cmd::docs::SUBCOMMANDS.len()
        );
        let client = listed(&["FILTERBY", "pattern", "CLIENT|K*"]);
        assert_eq!(client, ["client|kill"]);
        let blocking = listed(&["filterby", "ACLCAT", "Blocking"]);
        assert!(blocking.contains(&"blpop".to_string()) && !blocking.contains(&"lpop".to_string()));
        // A subcommand has its command's flags and group.
        assert!(listed(&["FILTERBY", "ACLCAT", "scripting"]).contains(&"script|load".to_string()));
        assert!(listed(&["FILTERBY", "ACLCAT", "nosuch"]).is_empty());
        assert!(listed(&["FILTERBY", "MODULE", "search"]).is_empty());
        for bad in [
            &["FILTERBY", "nosuch", "x"][..],
            &["FILTERBY", "PATTERN"],
            &["x"],
        ] {
            assert!(
                matches!(command_list(&TABLE, &words(bad)), Reply::Error(e) if e == "ERR syntax error")
            );
        }
    }
}
