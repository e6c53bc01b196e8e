//! User lookup from the guest's own `/etc/passwd`, parsed defensively (the
//! static binary cannot use NSS).

use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub shell: String,
}

pub fn root() -> User {
    User {
        name: "root".into(),
        uid: 0,
        gid: 0,
        home: "/root".into(),
        shell: "/bin/sh".into(),
    }
}

/// Finds a user by name or numeric uid in a passwd file's text.
pub fn find_in(passwd: &str, who: &str) -> Option<User> {
    let by_uid: Option<u32> = who.parse().ok();
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 {
            continue;
        }
        let (Ok(uid), Ok(gid)) = (f[2].parse::<u32>(), f[3].parse::<u32>()) else {
            continue;
        };
        if f[0] == who || by_uid == Some(uid) {
            return Some(User {
                name: f[0].into(),
                uid,
                gid,
                home: f[5].into(),
                shell: f[6].into(),
            });
        }
    }
    // A bare uid with no passwd entry is still a valid identity.
    by_uid.map(|uid| User {
        name: uid.to_string(),
        uid,
        gid: uid,
        home: "/".into(),
        shell: "/bin/sh".into(),
    })
}

pub fn lookup(who: &str) -> Option<User> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    match find_in(&passwd, who) {
        Some(u) => Some(u),
        None if who == "root" => Some(root()),
        None => None,
    }
}

/// Where relative file paths resolve: the default user's home, as LangSmith does.
pub fn default_home() -> &'static str {
    if Path::new("/home/user").is_dir() {
        "/home/user"
    } else {
        "/root"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_passwd_defensively() {
        let text = "root:x:0:0:root:/root:/bin/bash\nbroken\nbad:x:zz:1:::\nuser:x:1000:1000:U:/home/user:/bin/sh\n";
        assert_eq!(find_in(text, "user").unwrap().uid, 1000);
        assert_eq!(find_in(text, "1000").unwrap().name, "user");
        assert_eq!(find_in(text, "root").unwrap().home, "/root");
        assert!(find_in(text, "nobody").is_none());
        assert!(find_in(text, "bad").is_none());
        assert_eq!(find_in(text, "4242").unwrap().uid, 4242);
    }
}
