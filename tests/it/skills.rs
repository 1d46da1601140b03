//! Skills as a tool (`skill`): folders in Claude Code's format found in the configured
//! directories, listed in the tool's description, loaded by name with their files, limited
//! per role, governed like any tool, and reloaded (with `tools/list_changed`) when a folder
//! changes.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use guildhall::governance::{Action, Approval, GovernanceConfig, Rule};
use guildhall::mcp::{McpServer, ToolFilter};
use guildhall::runtime::AfterStart;
use guildhall::skills::Skills;
use guildhall::{AgentSpec, Runtime};
use serde_json::json;

use crate::mcp::Wire;
use crate::support::{as_agent, eventually};

fn skill(dir: &Path, folder: &str, name: &str, description: &str, body: &str) {
    let folder = dir.join(folder);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("SKILL.md"),
        format!("---\nname: {name}\ndescription: {description}\n---\n{body}\n"),
    )
    .unwrap();
}

async fn runtime(governance: GovernanceConfig) -> Runtime {
    let rt = Runtime::builder()
        .governance(governance)
        .build()
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("dev-1", "dev"))
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("lead", "tl"))
        .await
        .unwrap();
    rt
}

#[tokio::test]
async fn skills_are_listed_loaded_with_their_files_and_limited_per_role() {
    let dir = tempfile::tempdir().unwrap();
    let (claude, own) = (
        dir.path().join(".claude/skills"),
        dir.path().join(".guildhall/skills"),
    );
    skill(
        &claude,
        "review",
        "review",
        "Reviews a change line by line",
        "# Review\nRead the diff.",
    );
    std::fs::write(claude.join("review/checklist.md"), "- tests\n").unwrap();
    std::fs::create_dir_all(claude.join("review/scripts")).unwrap();
    std::fs::write(claude.join("review/scripts/lint.sh"), "true\n").unwrap();
    skill(&own, "release", "release", "Cuts a release", "Tag it.");
    // Not a skill: no front matter. Left out, never a reason to serve nothing.
    std::fs::create_dir_all(own.join("broken")).unwrap();
    std::fs::write(own.join("broken/SKILL.md"), "just text").unwrap();

    let rt = runtime(GovernanceConfig::default()).await;
    let roles = BTreeMap::from([("dev".to_owned(), vec!["rev*".to_owned()])]);
    let skills = Skills::start(&rt, vec![claude, own], roles).await.unwrap();
    assert_eq!(
        skills.catalog().keys().collect::<Vec<_>>(),
        ["release", "review"]
    );
    let description = rt.tool("skill").unwrap().description;
    assert!(
        description.contains("- review: Reviews a change line by line")
            && description.contains("- release: Cuts a release"),
        "{description}"
    );

    let loaded = rt
        .call_json("skill", json!({"name": "review"}), as_agent(&rt, "dev-1"))
        .await
        .unwrap();
    assert_eq!(
        loaded["instructions"], "# Review\nRead the diff.",
        "{loaded}"
    );
    assert_eq!(
        loaded["files"],
        json!(["checklist.md", "scripts/lint.sh"]),
        "{loaded}"
    );
    assert!(
        loaded["dir"].as_str().unwrap().ends_with("review"),
        "{loaded}"
    );
    // A role limited to `rev*` may not load the release skill; another role may.
    let refused = rt
        .call_json("skill", json!({"name": "release"}), as_agent(&rt, "dev-1"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("role `dev` may not load skill `release`"),
        "{refused}"
    );
    rt.call_json("skill", json!({"name": "release"}), as_agent(&rt, "lead"))
        .await
        .unwrap();
    let unknown = rt
        .call_json("skill", json!({"name": "deploy"}), as_agent(&rt, "lead"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        unknown.contains("no skill `deploy`; there are: release, review"),
        "{unknown}"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn a_skill_rule_that_asks_is_asked_like_any_tools() {
    let dir = tempfile::tempdir().unwrap();
    skill(dir.path(), "review", "review", "Reviews", "Read it.");
    let governance = GovernanceConfig {
        rules: vec![Rule::new("skill", Action::Ask).unwrap()],
        ..GovernanceConfig::default()
    };
    let rt = runtime(governance).await;
    let _skills = Skills::start(&rt, vec![dir.path().to_owned()], BTreeMap::new())
        .await
        .unwrap();
    // Asked: approved, the skill loads; denied, it does not. Each call is one question.
    let asker = crate::governance::Scripted::new(&[Approval::Once, Approval::Deny]);
    let options = || as_agent(&rt, "dev-1").asker(asker.clone());
    let loaded = rt
        .call_json("skill", json!({"name": "review"}), options())
        .await
        .unwrap();
    assert!(loaded.to_string().contains("Read it."), "{loaded}");
    let denied = rt
        .call_json("skill", json!({"name": "review"}), options())
        .await
        .unwrap_err();
    assert_eq!(denied.kind(), guildhall::ErrorKind::Denied, "{denied}");
    assert_eq!(asker.asked.load(std::sync::atomic::Ordering::SeqCst), 2);
    // Nobody to ask: refused as any tool whose rule asks.
    let err = rt
        .call_json("skill", json!({"name": "review"}), as_agent(&rt, "dev-1"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), guildhall::ErrorKind::Denied, "{err}");
    assert!(
        err.to_string()
            .contains("config rule `skill → ask` asks for approval, and nobody can be asked"),
        "{err}"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn a_skill_added_is_served_and_announced() {
    let dir = tempfile::tempdir().unwrap();
    skill(dir.path(), "review", "review", "Reviews", "Read it.");
    let rt = runtime(GovernanceConfig::default()).await;
    let _skills = Skills::start(&rt, vec![dir.path().to_owned()], BTreeMap::new())
        .await
        .unwrap();
    let mut wire = Wire::legacy(McpServer::new(rt.clone())).await;
    wire.request(1, "ping", json!({})).await;
    skill(
        dir.path(),
        "triage",
        "triage",
        "Sorts incoming bugs",
        "Label them.",
    );
    wire.next_where(|m| m["method"] == "notifications/tools/list_changed")
        .await;
    eventually(Duration::from_secs(10), || async {
        rt.tool("skill")
            .is_some_and(|t| t.description.contains("- triage: Sorts incoming bugs"))
    })
    .await;
    let loaded = rt
        .call_json("skill", json!({"name": "triage"}), as_agent(&rt, "dev-1"))
        .await
        .unwrap();
    assert_eq!(loaded["instructions"], "Label them.");
    // Removed: gone from the list, and loading it names what there is.
    std::fs::remove_dir_all(dir.path().join("triage")).unwrap();
    eventually(Duration::from_secs(10), || async {
        rt.tool("skill")
            .is_some_and(|t| !t.description.contains("triage"))
    })
    .await;
    rt.shutdown().await;
}

#[tokio::test]
async fn over_mcp_an_agent_sees_and_gets_as_prompts_only_the_skills_its_role_may_load() {
    let dir = tempfile::tempdir().unwrap();
    skill(
        dir.path(),
        "review",
        "review",
        "Reviews a change",
        "Read the diff.",
    );
    std::fs::write(dir.path().join("review/checklist.md"), "- tests\n").unwrap();
    skill(
        dir.path(),
        "release",
        "release",
        "Cuts a release",
        "Tag it.",
    );
    let dirs = vec![dir.path().to_owned()];
    let roles = BTreeMap::from([("dev".to_owned(), vec!["review".to_owned()])]);
    // As `guildhall serve` starts them: the runtime's `skills` subsystem.
    let rt = Runtime::builder()
        .subsystem(AfterStart::new("skills", move |runtime| async move {
            Skills::start(&runtime, dirs, roles).await
        }))
        .build()
        .await
        .unwrap();
    rt.register_agent(AgentSpec::new("dev-1", "dev"))
        .await
        .unwrap();
    let server = McpServer::new(rt.clone()).connection(Some("dev-1".into()), ToolFilter::all());
    let mut wire = Wire::legacy(server).await;
    let listed = wire.request(1, "tools/list", json!({})).await;
    let tool = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "skill")
        .unwrap()
        .clone();
    let description = tool["description"].as_str().unwrap();
    assert!(
        description.contains("- review: Reviews a change"),
        "{description}"
    );
    assert!(!description.contains("release"), "{description}");

    let prompts = wire.request(2, "prompts/list", json!({})).await;
    let names: Vec<&str> = prompts["result"]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .filter(|n| n.starts_with("skill__"))
        .collect();
    assert_eq!(names, ["skill__review"], "{prompts}");
    let got = wire
        .request(3, "prompts/get", json!({"name": "skill__review"}))
        .await;
    let text = got["result"]["messages"][0]["content"]["text"]
        .as_str()
        .unwrap();
    assert!(
        text.starts_with("Read the diff.") && text.contains("checklist.md"),
        "{got}"
    );
    // Asked for anyway, another role's skill is refused as the tool refuses it.
    let refused = wire
        .request(4, "prompts/get", json!({"name": "skill__release"}))
        .await;
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("may not load skill `release`"),
        "{refused}"
    );
    rt.shutdown().await;
}

#[tokio::test]
async fn a_skill_md_that_is_a_link_is_not_served() {
    let dir = tempfile::tempdir().unwrap();
    skill(dir.path(), "review", "review", "Reviews", "Read it.");
    // Elsewhere, a file in skill form, linked in as a skill's SKILL.md.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(
        outside.path().join("notes.md"),
        "---\nname: leak\ndescription: not a skill\n---\nsecret\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("leak")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("notes.md"),
        dir.path().join("leak/SKILL.md"),
    )
    .unwrap();
    let rt = runtime(GovernanceConfig::default()).await;
    let skills = Skills::start(&rt, vec![dir.path().to_owned()], BTreeMap::new())
        .await
        .unwrap();
    assert_eq!(skills.catalog().keys().collect::<Vec<_>>(), ["review"]);
    rt.shutdown().await;
}
