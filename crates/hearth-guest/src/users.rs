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

/// Names for the uids and gids of file entries, from the guest's own
/// `/etc/passwd` and `/etc/group` (read once per request).
pub struct Names {
    users: std::collections::HashMap<u32, String>,
    groups: std::collections::HashMap<u32, String>,
}

impl Names {
    pub fn load() -> Self {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        Self::parse(&read("/etc/passwd"), &read("/etc/group"))
    }

    fn parse(passwd: &str, group: &str) -> Self {
        let ids = |text: &str| {
            let mut m = std::collections::HashMap::new();
            for line in text.lines() {
                let f: Vec<&str> = line.split(':').collect();
                if let (Some(name), Some(Ok(id))) = (f.first(), f.get(2).map(|i| i.parse::<u32>()))
                {
                    m.entry(id).or_insert_with(|| (*name).to_owned());
                }
            }
            m
        };
        Self {
            users: ids(passwd),
            groups: ids(group),
        }
    }

    pub fn user(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    pub fn group(&self, gid: u32) -> String {
        self.groups
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

/// Who a file operation acts as: the agent itself (root), or a user whose
/// permissions the kernel checks and who owns what the operation creates.
#[derive(Clone, Debug)]
pub enum Actor {
    Root,
    User(User),
}

impl Actor {
    /// The actor a request names (`None`, `root` and uid 0 are root); an
    /// unknown user is refused.
    pub fn named(who: Option<&str>) -> Result<Self, String> {
        match who {
            None => Ok(Actor::Root),
            Some(w) => match lookup(w) {
                Some(u) if u.uid == 0 => Ok(Actor::Root),
                Some(u) => Ok(Actor::User(u)),
                None => Err(format!("user {w:?} does not exist")),
            },
        }
    }

    /// Where this actor's relative paths resolve.
    pub fn home(&self) -> &str {
        match self {
            Actor::Root => default_home(),
            Actor::User(u) => &u.home,
        }
    }

    /// Runs `f` off the async threads as this actor. As a user it runs on
    /// a thread of its own whose filesystem identity (`setfsuid`,
    /// `setfsgid`, and the user's group as its only group) is the user's:
    /// Linux keeps these per thread, so nothing else the agent does
    /// changes identity, and the thread ends with the call.
    pub async fn run<R, F>(&self, f: F) -> std::io::Result<R>
    where
        R: Send + 'static,
        F: FnOnce() -> R + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        match self {
            Actor::Root => {
                tokio::task::spawn_blocking(move || {
                    let _ = tx.send(Ok(f()));
                });
            }
            Actor::User(u) => {
                let (uid, gid) = (u.uid, u.gid);
                std::thread::Builder::new()
                    .name("as-user".into())
                    .spawn(move || {
                        let _ = tx.send(crate::sys::become_fs(uid, gid).map(|()| f()));
                    })?;
            }
        }
        rx.await
            .map_err(|_| std::io::Error::other("the file operation's thread ended"))?
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

    #[test]
    fn names_ids_and_falls_back_to_numbers() {
        let n = Names::parse(
            "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n",
            "root:x:0:\nusers:x:100:\nuser:x:1000:\nbroken\n",
        );
        assert_eq!(n.user(1000), "user");
        assert_eq!(n.group(100), "users");
        assert_eq!(n.user(4242), "4242");
        assert_eq!(n.group(7), "7");
    }

    /// Acting as a user is the kernel's own check, on one thread only
    /// (runs where the tests run as root, as the guest agent does).
    #[tokio::test]
    async fn a_user_acts_with_their_permissions_and_owns_what_they_make() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let dir = std::env::temp_dir().join(format!("hearth-actor-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("closed")).unwrap();
        std::fs::set_permissions(dir.join("closed"), std::fs::Permissions::from_mode(0o700))
            .unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let who = Actor::User(User {
            name: "t".into(),
            uid: 4242,
            gid: 4343,
            home: "/".into(),
            shell: "/bin/sh".into(),
        });
        let d = dir.clone();
        let made = who
            .run(move || std::fs::write(d.join("mine"), b"x"))
            .await
            .unwrap();
        made.unwrap();
        let meta = std::fs::metadata(dir.join("mine")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (4242, 4343));
        let d = dir.clone();
        let denied = who
            .run(move || std::fs::write(d.join("closed/x"), b"x"))
            .await
            .unwrap();
        assert_eq!(
            denied.unwrap_err().kind(),
            std::io::ErrorKind::PermissionDenied
        );
        // The agent's own threads are still root.
        std::fs::write(dir.join("closed/x"), b"x").unwrap();
        Actor::Root.run(|| ()).await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
