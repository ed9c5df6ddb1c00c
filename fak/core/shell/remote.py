"""Commands that change what others share: git (pushes, history, config), cloud and cluster CLIs, databases,
containers, package registries and deploys."""

from __future__ import annotations

import re

from fak.core.shell.argv import (
    _DEPLOY_VERBS,
    SQL_DESTROY,
    _branch,
    _cli_positionals,
    _downstream_net,
    _first,
    _host_of,
    _local_scratch_db,
    _name,
    _shared,
    _skip_opts,
)
from fak.core.shell.parse import Cmd, Word
from fak.core.shell.targets import UNKNOWN, Where, classify, display, resolve


class RemoteCommands:
    """A family of Judge's command handlers (c_<name>), mixed into fak.core.shell.commands.Judge."""


    def c_git(self, args: list[Word], c: Cmd) -> None:
        i = 0
        words = [_first(w) for w in args]
        where = c.where
        cfg: list[str] = []
        while i < len(words) and words[i].startswith("-"):
            if words[i].startswith(("--work-tree=", "--git-dir=")):
                where = where.at(resolve(words[i].split("=", 1)[1], where)) if words[i].startswith("--work-tree=") else where
                i += 1
                continue
            if words[i] in ("-C", "-c", "--git-dir", "--work-tree", "--namespace", "--exec-path") and i + 1 < len(words):
                if words[i] in ("-C", "--work-tree"):
                    where = where.at(resolve(words[i + 1], where))
                if words[i] == "-c":
                    cfg.append(words[i + 1])
                i += 2
                continue
            i += 1
        if i >= len(words):
            return
        sub, rest = words[i], words[i + 1:]
        for kv in cfg:
            key, _, val = kv.partition("=")
            key = key.lower()
            if not (val.startswith("!") or re.search(r"[;|&$`()<>]|\bsh\b|\bbash\b", val)):
                continue  # a plain value (core.pager=cat, alias.lg=log ...) runs nothing new
            if key in ("core.sshcommand", "core.fsmonitor", "core.pager", "core.editor", "core.hookspath") or \
                    key.startswith(("alias.", "credential.helper", "filter.", "diff.external")):
                self.add("opaque", f"git -c {kv}"[:60], "unknown", "a git setting that runs a command")
        if sub == "submodule" and "foreach" in rest[:2]:
            cmd = [w for w in rest[rest.index("foreach") + 1:] if not w.startswith("--")]
            if cmd:
                self.shell_text((" ".join(cmd),), c, "git submodule foreach")
        elif sub == "push":
            self.git_push(rest)
        elif sub == "config":
            self.git_config(rest, where)
        elif sub in ("filter-branch", "filter-repo"):
            self.add("history", "the repository's history", "remote", "git " + sub)
        elif sub == "reflog" and rest[:1] and rest[0] in ("expire", "delete"):
            self.add("history", "the reflog", "project-git", "git reflog " + rest[0])
        elif sub == "gc" and any(w.startswith("--prune=now") or w == "--prune=all" for w in rest):
            self.add("history", "unreachable objects", "project-git", "git gc --prune=now")
        elif sub == "update-ref" and "-d" in rest and any(_shared(_branch(w)) for w in rest):
            self.add("history", next(w for w in rest if _shared(_branch(w))), "remote", "git update-ref -d")
        elif sub == "branch" and any(w in ("-D", "-d", "--delete") or (w.startswith("-") and "D" in w) for w in rest) and \
                any(_shared(w) for w in rest):
            self.add("history", next(w for w in rest if _shared(w)), "remote", "git branch -D")
        elif sub == "clean":
            flags = "".join(w[1:] for w in rest if w.startswith("-") and not w.startswith("--"))
            if "f" in flags and "n" not in flags:
                cls = classify(where.cwd, where)  # git -C DIR clean: the untracked files of DIR's tree
                shown = ("untracked files" if cls in ("project", "project-root")
                         else "untracked files of " + display(where.cwd, c.where))
                self.add("delete", shown, "project" if cls == "project-root" else cls, "git clean")
        elif sub == "credential" and rest[:1] and rest[0] in ("fill", "get"):
            self.add("read-secret", "git credentials", "credential", "git credential " + rest[0])
        elif sub == "init" and "--template" in " ".join(rest):
            self.add("persist", "git template", "project-git", "git init --template")

    def git_push(self, rest: list[str]) -> None:
        force = any(w in ("-f", "--force", "--force-with-lease", "--force-if-includes") or w.startswith("--force")
                    or (w.startswith("-") and not w.startswith("--") and "f" in w[1:]) for w in rest)
        pos = [w for w in rest if not w.startswith("-")]
        refspecs = pos[1:] if pos else []
        if "--mirror" in rest:
            self.add("history", "every ref of " + (pos[0] if pos else "the remote"), "remote", "git push --mirror")
            return
        if ("--all" in rest or "--tags" in rest) and force:
            self.add("history", "every branch of " + (pos[0] if pos else "the remote"), "remote", "git push --force --all")
            return
        deleting = "--delete" in rest or "-d" in rest
        for r in refspecs:
            plus = r.startswith("+")
            src, _, dst = r.lstrip("+").partition(":")
            b = _branch(dst or src)
            if _shared(b) and (force or plus):
                self.add("history", b, "remote", "git push --force" if force else f"git push +{r.lstrip('+')}")
                return
            if _shared(b) and (deleting or (r.startswith(":"))):
                self.add("history", b, "remote", "git push --delete")
                return

    def git_config(self, rest: list[str], where: Where) -> None:
        pos = [w for w in rest if not w.startswith("-")]
        if not pos or any(w in ("--get", "--list", "-l", "--get-all", "--get-regexp", "--show-origin") for w in rest):
            return
        key = pos[0].lower()
        if len(pos) < 2 and "--unset" not in rest:
            return
        if key in ("core.hookspath", "core.sshcommand", "core.fsmonitor", "core.pager", "core.editor",
                   "core.askpass", "sequence.editor", "gpg.program", "core.gitproxy", "include.path",
                   "init.templatedir") or key.startswith(("credential.", "alias.", "filter.", "diff.",
                                                          "url.", "includeif.", "uploadpack.", "receive.")):
            self.add("persist", f"git config {pos[0]}", "project-git" if "--global" not in rest else "home",
                     "git config " + pos[0])

    def c_terraform(self, args: list[Word], c: Cmd, name: str = "terraform") -> None:
        words = [_first(w) for w in args]
        pos = [w for w in words if not w.startswith("-")]
        if "destroy" in pos or ("apply" in pos and ("-destroy" in words or "--destroy" in words)) or \
                (pos[:2] == ["state", "rm"]) or (pos[:1] == ["workspace"] and "delete" in pos):
            self.add("teardown", "infrastructure", "remote", name + " " + " ".join(pos[:2]))
        elif pos[:1] == ["apply"]:  # changes shared infrastructure: a person confirms, as for kubectl apply
            self.add("publish", "infrastructure", "remote", name + " apply")



    def c_pulumi(self, args: list[Word], c: Cmd, name: str = "pulumi") -> None:
        words = [_first(w) for w in args if not _first(w).startswith("-")]
        if any(w in ("destroy", "remove", "rm") for w in words) and not (name == "pulumi" and words[:1] == ["config"]):
            self.add("teardown", "stack", "remote", name + " " + " ".join(words[:2]))
        elif words[:1] == ["deploy"] and name in ("serverless", "sls", "cdk", "cdktf"):
            self.add("publish", "stack", "remote", name + " deploy")





    def c_aws(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"--region", "--profile", "--output", "--endpoint-url", "--query",
                                                "--cli-read-timeout", "--ca-bundle", "--color"}))
        if len(pos) < 2:
            return
        svc, verb = pos[0], pos[1]
        words = [_first(w) for w in args]
        if (svc == "s3" and verb == "rb") or (svc == "s3" and verb == "rm" and "--recursive" in words) or \
                verb.startswith(("delete-", "terminate-", "remove-", "deregister-", "purge-", "disable-")) or \
                verb in ("schedule-key-deletion", "delete", "empty") or (svc == "s3api" and verb.startswith("delete")):
            self.add("teardown", f"aws {svc} {' '.join(pos[2:3])}".strip(), "remote", f"aws {svc} {verb}")
        elif svc == "configure" and verb in ("export-credentials", "get") and (verb == "export-credentials" or any(
                "secret" in p or "key" in p or "token" in p for p in pos[2:])):
            self.add("read-secret", "aws credentials", "credential", f"aws configure {verb}")
        elif svc in ("sts", "ecr", "codeartifact") and verb.startswith(("get-session-token", "get-login-password",
                                                                        "get-authorization-token", "assume-role")):
            if _downstream_net(c):
                self.add("send", _host_of(_downstream_net(c)[0]), "credential", f"aws {svc} {verb}")
        elif svc == "secretsmanager" and verb == "get-secret-value" or svc == "ssm" and verb == "get-parameter" and \
                "--with-decryption" in words:
            self.add("read-secret", f"aws {svc}", "credential", f"aws {svc} {verb}")
        elif svc == "s3" and verb in ("cp", "sync", "mv") and len(pos) >= 4:
            dst = pos[-1]
            if dst.startswith("s3://"):
                self.send(dst[5:].split("/")[0], [(p,) for p in pos[2:-1]], c, f"aws s3 {verb}")

    def c_gcloud(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"--project", "--zone", "--region", "--format", "--account",
                                                "--configuration", "--filter"}))
        if "delete" in pos or "destroy" in pos or ("projects" in pos and "delete" in pos):
            self.add("teardown", "gcloud " + " ".join(pos[:3]), "remote", "gcloud delete")
        elif "print-access-token" in pos or "print-identity-token" in pos:
            self.add("read-secret", "gcloud token", "credential", "gcloud auth print-access-token")
        elif "deploy" in pos[:3]:
            self.add("publish", "gcloud " + " ".join(pos[:2]), "remote", "gcloud deploy")

    def c_az(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"-n", "--name", "-g", "--resource-group", "--subscription", "-o",
                                                "--output", "--query"}))
        if "delete" in pos or "purge" in pos:
            self.add("teardown", "az " + " ".join(pos[:2]), "remote", "az delete")
        elif "get-access-token" in pos:
            self.add("read-secret", "az token", "credential", "az account get-access-token")

    def c_doctl(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"--context", "-o", "--output"}))
        if "delete" in pos or "rm" in pos:
            self.add("teardown", "doctl " + " ".join(pos[:2]), "remote", "doctl delete")

    def c_kubectl(self, args: list[Word], c: Cmd, name: str = "kubectl") -> None:
        pos = _cli_positionals(args, frozenset({"--context", "-n", "--namespace", "--kubeconfig", "-o", "--output",
                                                "-l", "--selector", "--cluster", "--user", "-f", "--filename",
                                                "-c", "--container"}))
        words = [_first(w) for w in args]
        if pos[:2] == ["config", "view"] and ("--raw" in words or "--flatten" in words):
            self.add("read-secret", "kubeconfig tokens", "credential", f"{name} config view --raw")
            return
        if pos[:1] == ["exec"] and "--" in words:  # the command runs inside the pod: judged as it is
            inner = args[words.index("--") + 1:]
            if inner:
                self.run(inner, Cmd(inner, c.where.at("/")))
            return
        recreated = {"pod", "pods", "po", "job", "jobs", "event", "events", "ev"}
        if pos[:1] == ["delete"] and len(pos) > 1 and pos[1].split("/")[0] in recreated and "--all" not in words:
            pass  # a pod or job is recreated by its controller
        elif pos[:1] == ["delete"] or pos[:1] == ["drain"] or (pos[:1] == ["scale"] and "--replicas=0" in words):
            self.add("teardown", f"{name} {' '.join(pos[:3])}", "remote", f"{name} {pos[0]}")
        elif pos[:2] in (["get", "secret"], ["get", "secrets"]) and any(w.startswith(("-o", "--output"))
                                                                         for w in words):
            self.add("read-secret", "kubernetes secrets", "credential", f"{name} get secrets -o")
        elif pos[:1] == ["apply"] or pos[:1] == ["replace"] or pos[:1] == ["patch"]:
            if "--dry-run" not in " ".join(words):
                self.add("publish", f"{name} {pos[0]}", "remote", f"{name} {pos[0]}")


    def c_helm(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"-n", "--namespace", "--kube-context", "--kubeconfig"}))
        if pos[:1] and pos[0] in ("uninstall", "delete", "del", "un"):
            self.add("teardown", "helm release " + " ".join(pos[1:2]), "remote", "helm " + pos[0])
        elif pos[:1] == ["push"]:
            self.add("publish", "helm chart", "remote", "helm push")
        elif pos[:1] and pos[0] in ("install", "upgrade", "rollback") and "--dry-run" not in " ".join(_first(w) for w in args):
            self.add("publish", "helm release " + " ".join(pos[1:2]), "remote", "helm " + pos[0])

    def c_eksctl(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset())
        if pos[:1] == ["delete"]:
            self.add("teardown", "eks " + " ".join(pos[1:3]), "remote", "eksctl delete")

    def c_heroku(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"-a", "--app"}))
        if pos[:1] and pos[0] in ("apps:destroy", "pg:reset", "destroy", "addons:destroy"):
            self.add("teardown", "heroku " + pos[0], "remote", "heroku " + pos[0])

    def c_fly(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"-a", "--app"}))
        if "destroy" in pos:
            self.add("teardown", "fly app", "remote", "fly destroy")
        elif pos[:1] == ["deploy"]:
            self.add("publish", "fly app", "remote", "fly deploy")

    def c_deployer(self, args: list[Word], c: Cmd, name: str) -> None:
        """Hosting CLIs whose verb puts the project live (vercel --prod, firebase deploy, wrangler deploy ...)."""
        words = [_first(w) for w in args]
        pos = [w for w in words if not w.startswith("-")]
        verbs = _DEPLOY_VERBS[name]
        if (pos[:1] and pos[0] in verbs) or (not verbs and "--help" not in words) or (name == "vercel" and "--prod" in words):
            if "--dry-run" not in words:
                self.add("publish", f"{name} deployment", "remote", f"{name} {' '.join(pos[:1])}".strip())

    c_flyctl = c_fly

    def c_gh(self, args: list[Word], c: Cmd) -> None:
        pos = _cli_positionals(args, frozenset({"-R", "--repo", "-H", "--hostname"}))
        if pos[:2] == ["repo", "delete"]:
            self.add("teardown", "github repository", "remote", "gh repo delete")
        elif pos[:2] == ["auth", "token"] or (pos[:2] == ["auth", "status"] and "--show-token" in [_first(w) for w in args]):
            self.add("read-secret", "github token", "credential", "gh auth token")
        elif pos[:1] == ["release"] and pos[1:2] and pos[1] in ("create", "upload", "edit", "delete"):
            self.add("publish", "github release", "remote", "gh release " + pos[1])
        elif pos[:1] == ["api"] and any(_first(w) in ("-X", "--method") for w in args) and "DELETE" in [_first(w) for w in args]:
            self.add("teardown", "github api " + " ".join(pos[1:2]), "remote", "gh api -X DELETE")

    def c_docker(self, args: list[Word], c: Cmd, name: str = "docker") -> None:
        pos = _cli_positionals(args, frozenset({"-H", "--host", "--context", "--config", "-l", "--log-level"}))
        words = [_first(w) for w in args]
        if not pos:
            return
        verb = pos[0]
        if verb == "container" and len(pos) > 1:
            verb = pos[1]
        if verb in ("run", "create") or (verb == "container" and pos[1:2] == ["run"]):
            i = words.index(verb) if verb in words else 0
            opts = words[i + 1:]
            for j, a in enumerate(opts):
                v = opts[j + 1] if j + 1 < len(opts) else ""
                if a == "--privileged" or a in ("--pid=host", "--net=host", "--network=host", "--ipc=host",
                                                "--userns=host", "--uts=host") or (a in ("--pid", "--userns", "--cap-add") and
                                                                                  v in ("host", "ALL", "SYS_ADMIN")) or \
                        a.startswith("--cap-add=") and a.split("=", 1)[1] in ("ALL", "SYS_ADMIN", "SYS_PTRACE"):
                    self.add("escalate", f"{name} {a}", "system", f"{name} run {a}")
                    return
                mount = ""
                if a in ("-v", "--volume", "--mount"):
                    mount = v
                elif a.startswith(("-v", "--volume=", "--mount=")) and len(a) > 2:
                    mount = a.split("=", 1)[1] if "=" in a and not a.startswith("-v") else a[2:]
                if mount:
                    src = mount.split(":", 1)[0] if "source=" not in mount and "src=" not in mount else \
                        re.search(r"(?:source|src)=([^,]+)", mount).group(1)  # type: ignore[union-attr]
                    if src.startswith(("/", "~", ".", "$")):
                        p = resolve(src, c.where)
                        cls = classify(p, c.where)
                        if cls in ("root", "system", "home", "credential", "device") or p == "/var/run/docker.sock":
                            self.add("escalate", f"{display(p, c.where)} mounted into a container", cls,
                                     f"{name} run -v {src}")
                            return
        elif verb in ("system", "volume", "image", "builder", "network") and len(pos) > 1 and pos[1] in ("prune", "rm") \
                and (verb != "image" or "-a" in words or "--all" in words):
            if verb == "system" and not any(w in ("--all", "--volumes") or (w.startswith("-") and "a" in w and w[1:2] != "-")
                                            for w in words):
                return
            self.add("teardown", f"{name} {verb}s", "remote", f"{name} {verb} {pos[1]}")
        elif verb in ("rm", "rmi", "kill", "stop") and any("$(" in w or "`" in w or w == UNKNOWN for w in words) or \
                (verb == "rm" and any(a.startswith(UNKNOWN) for a in words)):
            self.add("teardown", f"every {name} container", "remote", f"{name} {verb} $({name} ps -aq)")
        elif verb == "push" or (verb == "image" and pos[1:2] == ["push"]) or (verb == "buildx" and "--push" in words):
            self.add("publish", f"{name} image", "remote", f"{name} push")



    def c_dropdb(self, args: list[Word], c: Cmd) -> None:
        self.add("teardown", "database", "remote", "dropdb")

    def c_psql(self, args: list[Word], c: Cmd, name: str = "psql", flags: tuple[str, ...] = ("-c", "--command")) -> None:
        words = [_first(w) for w in args]
        sql = []
        for i, a in enumerate(words):
            if a in flags and i + 1 < len(words):
                sql.append(words[i + 1])
            elif any(a.startswith(f + "=") for f in flags if f.startswith("--")):
                sql.append(a.split("=", 1)[1])
        if c.heredoc:
            sql.append(c.heredoc)
        if c.stdin is not None and _name(c.stdin) in ("echo", "printf"):
            sql.append(" ".join(_first(w) for w in c.stdin.argv[1:]))
        if c.stdin is not None and _name(c.stdin) == "cat" and c.stdin.heredoc:
            sql.append(c.stdin.heredoc)
        if name in ("sqlite3",):
            pos, skip = [], False
            for w in words:  # sqlite3's options are single-dash words, some with a value
                if skip:
                    skip = False
                elif w in ("-cmd", "-separator", "-nullvalue", "-init", "-newline"):
                    skip = True
                elif not w.startswith("-"):
                    pos.append(w)
            if pos and classify(resolve(pos[0], c.where), c.where) in ("temp", "project") or pos[:1] == [":memory:"]:
                return  # a scratch or project database file: the project's own data
            sql += pos[1:]
        if name in ("redis-cli",):
            sql.append(" ".join(w for w in words if not w.startswith("-")))
        cls = "project" if _local_scratch_db(name, words) else "remote"
        for s in sql:
            m = SQL_DESTROY.search(s)
            if m:
                self.add("teardown", m.group(0).strip()[:40], cls, f"{name} {m.group(0).split()[0]}")
                return

    def c_mysql(self, args: list[Word], c: Cmd) -> None:
        self.c_psql(args, c, "mysql", ("-e", "--execute"))

    c_mariadb = c_mysql

    def c_sqlite3(self, args: list[Word], c: Cmd) -> None:
        pos = [w for w in args if not _first(w).startswith("-")]
        self.paths("read", pos[:1], c.where, "sqlite3")
        self.c_psql(args, c, "sqlite3", ("-cmd",))

    def c_redis_cli(self, args: list[Word], c: Cmd) -> None:
        self.c_psql(args, c, "redis-cli", ())

    def c_mongo(self, args: list[Word], c: Cmd) -> None:
        self.c_psql(args, c, "mongo", ("--eval",))

    c_mongosh = c_mongo

    def c_clickhouse_client(self, args: list[Word], c: Cmd) -> None:
        self.c_psql(args, c, "clickhouse-client", ("-q", "--query"))

    def c_cqlsh(self, args: list[Word], c: Cmd) -> None:
        self.c_psql(args, c, "cqlsh", ("-e", "--execute"))

    def c_pip(self, args: list[Word], c: Cmd, name: str = "pip") -> None:
        pos = [_first(w) for w in args if not _first(w).startswith("-")]
        if pos[:2] in (["config", "set"], ["config", "edit"]) and any(re.search(r"index-url|trusted-host|find-links", p)
                                                                       for p in pos[2:3]):
            self.add("persist", "pip " + pos[2], "home", f"{name} config set (where every later install comes from)")

    c_pip3 = c_pip

    def c_npm(self, args: list[Word], c: Cmd, name: str = "npm") -> None:
        pos = [_first(w) for w in args if not _first(w).startswith("-")]
        if pos[:2] == ["config", "set"] and any(p.split("=")[0].endswith("registry") for p in pos[2:3]):
            self.add("persist", "npm registry", "home", f"{name} config set registry (where every later install comes from)")
        if pos[:2] == ["pkg", "set"] and any(p.startswith("scripts.") for p in pos[2:]):
            pkg = resolve("package.json", c.where)
            if classify(pkg, c.where) not in ("project", "temp"):  # a lifecycle script another repo will run
                self.add("persist", display(pkg, c.where), classify(pkg, c.where), f"{name} pkg set scripts")
        if pos[:1] and pos[0] in ("publish", "unpublish", "deprecate") or pos[:2] in (["dist-tag", "add"], ["dist-tag", "rm"],
                                                                                      ["owner", "add"], ["owner", "rm"]):
            if "--dry-run" not in [_first(w) for w in args]:
                self.add("publish", f"{name} package", "remote", f"{name} {pos[0]}")

    c_yarn = c_pnpm = c_npm

    def c_twine(self, args: list[Word], c: Cmd) -> None:
        if args and _first(args[0]) == "upload":
            self.add("publish", "python package", "remote", "twine upload")

    def c_cargo(self, args: list[Word], c: Cmd, name: str = "cargo") -> None:
        pos = [_first(w) for w in args if not _first(w).startswith("-")]
        if "publish" in pos[:2] and "--dry-run" not in [_first(w) for w in args]:
            self.add("publish", f"{name} package", "remote", f"{name} publish")





    def c_gem(self, args: list[Word], c: Cmd) -> None:
        if args and _first(args[0]) in ("push", "yank"):
            self.add("publish", "gem", "remote", "gem " + _first(args[0]))

    def c_mvn(self, args: list[Word], c: Cmd) -> None:
        if any(_first(w) in ("deploy", "release:perform") for w in args):
            self.add("publish", "maven artifact", "remote", "mvn deploy")

    def c_gradle(self, args: list[Word], c: Cmd) -> None:
        if any(_first(w).startswith("publish") for w in args):
            self.add("publish", "gradle publication", "remote", "gradle publish")

    c_gradlew = c_gradle

    def c_dotnet(self, args: list[Word], c: Cmd) -> None:
        words = [_first(w) for w in args]
        if words[:2] == ["nuget", "push"]:
            self.add("publish", "nuget package", "remote", "dotnet nuget push")

    def c_npx(self, args: list[Word], c: Cmd) -> None:
        rest = _skip_opts(args, {"-p", "--package", "-c", "--call"})
        if rest:
            self.run([(_first(rest[0]).split("@")[0] if not _first(rest[0]).startswith("@") else _first(rest[0]),), *rest[1:]], c)

    c_pnpx = c_bunx = c_npx
