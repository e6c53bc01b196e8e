"""The web console in a real headless browser (issue 21).

Debian's chromium driven over WebDriver (selenium, chromedriver) against a
live `hearth up` (started by crates/hearth-cli/tests/cli/vm/console.rs):
sign in; create a sandbox and watch it become ready without reloading;
rename it and capture a snapshot of it (deleted again from its page);
type in the terminal and read the answer from the screen; resize and see
`stty size` follow; drop the connection mid-command and lose no output;
Ctrl-C; upload a file and download it back byte-identical; stop and
start; delete; another workspace sees nothing; a revoked key is signed
out. Each page is screenshotted and checked with axe-core (no serious or
critical violations).

Environment: HEARTH_URL, HEARTH_API_KEY, HEARTH_OTHER_KEY, HEARTH_BIN and
HEARTH_DATA_DIR (to make and revoke a key), HEARTH_AXE_JS (axe-core's
script), HEARTH_CONSOLE_SHOTS (where screenshots go), HEARTH_CONSOLE_IMAGE
(the snapshot to create from). Prints PASS/FAIL per test; exits 1 on any
failure.
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

URL = os.environ["HEARTH_URL"].rstrip("/")
KEY = os.environ["HEARTH_API_KEY"]
OTHER_KEY = os.environ["HEARTH_OTHER_KEY"]
SHOTS = os.environ.get("HEARTH_CONSOLE_SHOTS") or tempfile.mkdtemp(prefix="console-shots-")
IMAGE = os.environ.get("HEARTH_CONSOLE_IMAGE", "busybox")
AXE = open(os.environ["HEARTH_AXE_JS"], encoding="utf-8").read()
BOOT = 240  # seconds a create may take to become ready under TCG
NAME = "console-e2e"
RENAMED = "console-e2e-renamed"
SNAPSHOT = "console-snap"

os.makedirs(SHOTS, exist_ok=True)
DOWNLOADS = tempfile.mkdtemp(prefix="console-downloads-")


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-dev-shm-usage", "--window-size=1280,900"):
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={tempfile.mkdtemp(prefix='console-chromium-')}")
    opts.add_experimental_option("prefs", {
        "download.default_directory": DOWNLOADS,
        "download.prompt_for_download": False,
    })
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    d.execute_cdp_cmd("Browser.setDownloadBehavior",
                      {"behavior": "allow", "downloadPath": DOWNLOADS})
    return d


def api(method, path, key=KEY, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(URL + path, data=data, method=method,
                                 headers={"X-Api-Key": key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def fetch_text(url):
    """The body at `url` (no key), or None while it fails."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return None


def wait(d, cond, timeout=30, what="a condition"):
    try:
        return WebDriverWait(d, timeout, poll_frequency=0.2).until(cond)
    except TimeoutException:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def shot(d, name):
    d.save_screenshot(os.path.join(SHOTS, f"{name}.png"))


def axe(d, page):
    """axe-core on the current page: no serious or critical violation."""
    d.execute_script(AXE)
    result = d.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']}).then(r => done(r.violations))"
        ".catch(e => done([{id: 'axe-error', impact: 'critical', help: String(e), nodes: []}]));")
    bad = [v for v in result if v.get("impact") in ("serious", "critical")]
    assert not bad, f"{page}: accessibility violations: " + "; ".join(
        f"{v['id']} ({v['impact']}): {v['help']} at {[n.get('target') for n in v['nodes']][:3]}"
        for v in bad)


def sign_in(d, key, keyboard=False):
    d.get(URL + "/console/")
    field = wait(d, EC.presence_of_element_located((By.ID, "api-key")), what="the sign-in form")
    clear_field(field)
    if keyboard:
        # The form is usable without a pointer: Enter submits it.
        field.send_keys(key + Keys.ENTER)
        return
    field.send_keys(key)
    d.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def clear_field(el):
    """Empties an input the way a user does (WebDriver's clear() fires no
    input event, so the page would not hear it)."""
    el.send_keys(Keys.CONTROL + "a", Keys.BACKSPACE)


def text_of(d, css):
    """The text of the first element `css` matches, or None; read in the
    page in one step (the page re-renders every two seconds, so a found
    element may be replaced before WebDriver reads it)."""
    return d.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : null", css)


def cpu_percent(d):
    text = text_of(d, ".usage-cpu") or ""
    m = re.match(r"([0-9.]+) %", text)
    return float(m.group(1)) if m else -1.0


def row_status(d, name):
    return text_of(d, f"tr[data-name='{name}'] .status")


def screen(d):
    return d.execute_script(
        "const t = window.hearthTerminal && window.hearthTerminal.terminal;"
        "if (!t) return '';"
        "const b = t.buffer.active; const lines = [];"
        "for (let i = 0; i < b.length; i++) lines.push(b.getLine(i).translateToString(true));"
        "return lines.join('\\n');")


def type_in(d, text):
    box = d.find_element(By.CSS_SELECTOR, ".xterm-helper-textarea")
    box.send_keys(text)


def until_screen(d, pattern, timeout=30):
    rx = re.compile(pattern, re.M)
    return wait(d, lambda d: rx.search(screen(d)), timeout, f"{pattern!r} on the terminal")


# ---------------------------------------------------------------------------

STATE = {}


def test_sign_in_refuses_a_wrong_key_then_accepts_the_right_one(d):
    sign_in(d, "hth_not_a_key")
    alert = wait(d, EC.presence_of_element_located((By.CSS_SELECTOR, ".alert")), what="the refusal")
    assert "Sign-in refused" in alert.text, alert.text
    shot(d, "sign-in")
    axe(d, "sign-in")
    sign_in(d, KEY, keyboard=True)
    wait(d, EC.presence_of_element_located((By.ID, "sandboxes-title")), what="the sandbox list")
    # The key is kept in the tab's session only.
    assert d.execute_script("return sessionStorage.getItem('hearth.apiKey')") == KEY
    assert d.execute_script("return localStorage.length") == 0
    assert d.get_cookies() == []


def test_create_a_sandbox_and_watch_it_become_ready(d):
    d.find_element(By.XPATH, "//button[normalize-space()='New sandbox']").click()
    form = wait(d, EC.presence_of_element_located((By.CSS_SELECTOR, "form.create")), what="the form")
    form.find_element(By.NAME, "name").send_keys(NAME)
    wait(d, lambda d: any(o.get_attribute("value") == IMAGE for o in
                          form.find_elements(By.CSS_SELECTOR, "select[name=snapshot] option")),
         what=f"snapshot {IMAGE} in the form")
    Select(form.find_element(By.NAME, "snapshot")).select_by_value(IMAGE)
    form.find_element(By.NAME, "mem").send_keys("2")
    form.find_element(By.NAME, "labels").send_keys("suite=console")
    # Persistent: its disk is kept, so it can be captured as a snapshot.
    form.find_element(By.NAME, "persistent").click()
    shot(d, "create")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    # The list updates by itself: provisioning, then ready (no reload).
    marker = d.execute_script("window.__noReload = 1; return 1")
    wait(d, lambda d: row_status(d, NAME) is not None, 30, "the new row")
    wait(d, lambda d: row_status(d, NAME) == "ready", BOOT, f"{NAME} ready")
    assert d.execute_script("return window.__noReload") == marker, "the page reloaded"
    # The row names its snapshot and how long it has been idle.
    wait(d, lambda d: text_of(d, f"tr[data-name='{NAME}'] .box-snapshot") == IMAGE, 70,
         f"the snapshot's name {IMAGE} in the row")
    idle = text_of(d, f"tr[data-name='{NAME}'] .box-idle") or ""
    assert re.fullmatch(r"\d+ (s|min)", idle), f"idle time {idle!r}"
    # Filters: by label and by status.
    d.find_element(By.XPATH, "//label[contains(., 'Labels')]/input").send_keys("suite=other")
    wait(d, lambda d: row_status(d, NAME) is None, 10, "the label filter to hide it")
    clear_field(d.find_element(By.XPATH, "//label[contains(., 'Labels')]/input"))
    Select(d.find_element(By.XPATH, "//label[contains(., 'Status')]/select")).select_by_value("ready")
    wait(d, lambda d: row_status(d, NAME) == "ready", 10, "the status filter to keep it")
    shot(d, "sandboxes")
    axe(d, "sandboxes")
    # At phone width nothing but the table's own box scrolls sideways.
    d.set_window_size(390, 844)
    time.sleep(0.5)
    overflow = d.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the page is {overflow}px wider than a phone's screen"
    shot(d, "sandboxes-phone")
    d.set_window_size(1280, 900)


def test_terminal_runs_commands_resizes_and_survives_a_dropped_connection(d):
    d.find_element(By.LINK_TEXT, NAME).click()
    wait(d, lambda d: text_of(d, ".term-state") == "connected", 60, "the terminal")
    type_in(d, "echo $((6*7))\n")
    # The shell's first answer: under TCG on a loaded CI machine (a guest
    # starved of its host's CPU fell 30 s behind once) it may be slow.
    until_screen(d, r"^42\s*$", 90)

    # Resize: the PTY follows the terminal's size.
    before = d.execute_script("const t = window.hearthTerminal.terminal; return [t.rows, t.cols]")
    type_in(d, "stty size\n")
    until_screen(d, rf"^{before[0]} {before[1]}\s*$")
    d.set_window_size(900, 700)
    wait(d, lambda d: d.execute_script(
        "const t = window.hearthTerminal.terminal; return [t.rows, t.cols]") != before, 10,
         "the terminal to refit")
    after = d.execute_script("const t = window.hearthTerminal.terminal; return [t.rows, t.cols]")
    type_in(d, "clear; stty size\n")
    until_screen(d, rf"^{after[0]} {after[1]}\s*$")
    d.set_window_size(1280, 900)

    # Colours reach the screen as attributes, not as escape text.
    type_in(d, "printf '\\033[31mred\\033[0m\\n'\n")
    until_screen(d, r"^red\s*$")
    assert "\x1b[31m" not in screen(d)

    # Ctrl-C interrupts the foreground command.
    type_in(d, "sleep 100\n")
    time.sleep(1)
    type_in(d, Keys.CONTROL + "c")
    type_in(d, "echo after-int\n")
    until_screen(d, r"^after-int\s*$", 20)

    # A dropped connection: output written meanwhile arrives after the
    # reconnect, once.
    type_in(d, "sleep 2; echo late-$((3*5))\n")
    time.sleep(0.3)
    d.execute_script("window.hearthTerminal.drop()")
    until_screen(d, r"^late-15\s*$", 30)
    wait(d, lambda d: text_of(d, ".term-state") == "connected", 30,
         "the terminal to reconnect")
    assert len(re.findall(r"^late-15\s*$", screen(d), re.M)) == 1, screen(d)
    type_in(d, "echo still-$((2*4))\n")
    until_screen(d, r"^still-8\s*$")

    # The usage charts: memory is measured, and a busy loop shows as CPU.
    wait(d, lambda d: (text_of(d, ".usage-mem") or "–") != "–", 20, "the memory figure")
    type_in(d, "timeout 10 sh -c 'while :; do :; done'\n")
    wait(d, lambda d: cpu_percent(d) > 30, 30, "the CPU figure to show the busy loop")
    assert d.find_elements(By.CSS_SELECTOR, ".usage canvas"), "no chart drawn"
    assert text_of(d, ".usage-conns") == "0 / 0", text_of(d, ".usage-conns")
    d.execute_script("window.scrollTo(0, 0)")
    shot(d, "sandbox")
    axe(d, "sandbox")


def test_upload_then_download_is_byte_identical(d):
    payload = os.urandom(200_000) + bytes(range(256))
    src = os.path.join(tempfile.mkdtemp(prefix="console-upload-"), "blob.bin")
    with open(src, "wb") as f:
        f.write(payload)
    d.find_element(By.CSS_SELECTOR, "input[type=file]").send_keys(src)
    d.find_element(By.XPATH, "//button[normalize-space()='Upload']").click()
    button = wait(d, EC.element_to_be_clickable(
        (By.XPATH, "//button[@aria-label='Download /root/blob.bin']")), 30, "the uploaded file listed")
    button.click()
    target = os.path.join(DOWNLOADS, "blob.bin")
    wait(d, lambda d: os.path.exists(target) and os.path.getsize(target) == len(payload), 30,
         "the download")
    with open(target, "rb") as f:
        assert f.read() == payload, "the downloaded file differs"
    # And the guest has the same bytes.
    type_in(d, "md5sum /root/blob.bin\n")
    until_screen(d, hashlib.md5(payload).hexdigest())

    # A download link, fetched without a key, has the same bytes too.
    form = d.find_element(By.CSS_SELECTOR, "form[aria-label='Download link']")
    form.find_element(By.NAME, "file").send_keys("/root/blob.bin")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    link = wait(d, lambda d: d.find_elements(By.LINK_TEXT, "/root/blob.bin"), 20, "the link")[0]
    with urllib.request.urlopen(link.get_attribute("href"), timeout=60) as r:
        assert r.read() == payload, "the download link's bytes differ"

    # A service URL reaches a server in the sandbox.
    type_in(d, "echo hello-from-$((40+2)) > /root/index.html; httpd -p 8000 -h /root\n")
    time.sleep(1)
    form = d.find_element(By.CSS_SELECTOR, "form[aria-label='Service URL']")
    form.find_element(By.NAME, "port").send_keys("8000")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    link = wait(d, lambda d: d.find_elements(By.LINK_TEXT, "port 8000"), 20, "the service link")[0]
    url = link.get_attribute("href")
    # The link is the hand-off on the port's own origin (issue 39): the
    # browser gets the token as that origin's cookie and goes on to the page.
    assert "/.hearth/auth?token=" in url and "://8000-" in url, url

    # In a tab of its own, as a click on the link opens it; the console's
    # tab goes on.
    console = d.current_window_handle
    d.switch_to.new_window("tab")
    try:
        def served(d):
            d.get(url + "&next=%2Findex.html")
            return "hello-from-42" in d.page_source and d.current_url

        at = wait(d, served, 30, "the service to answer")
        assert at.split("/")[2].startswith("8000-"), f"served on the port's own origin: {at}"
    finally:
        d.close()
        d.switch_to.window(console)


def answer_prompt(d, text):
    prompt = wait(d, EC.alert_is_present(), 5, "the prompt")
    prompt.send_keys(text)
    prompt.accept()


def test_rename_and_capture_a_snapshot(d):
    d.find_element(By.XPATH, "//button[normalize-space()='Rename']").click()
    answer_prompt(d, RENAMED)
    wait(d, lambda d: text_of(d, "#sandbox-title") == RENAMED, 20, "the new name")
    assert d.current_url.endswith(f"#/sandboxes/{RENAMED}"), d.current_url
    assert api("GET", f"/api/v2/sandboxes/boxes/{RENAMED}")[0] == 200
    wait(d, lambda d: text_of(d, ".term-state") == "connected", 60, "the terminal after the rename")
    d.find_element(By.XPATH, "//button[normalize-space()='Capture snapshot']").click()
    answer_prompt(d, SNAPSHOT)

    def captured(d):
        refused = text_of(d, ".alert")
        assert not refused, f"the capture was refused: {refused}"
        return any(s["name"] == SNAPSHOT and s["status"] == "ready"
                   for s in api("GET", "/api/v2/sandboxes/snapshots?page_size=200")[1]["items"])
    wait(d, captured, BOOT, "the captured snapshot ready")


def test_share_a_port_with_signed_in_users_then_stop_sharing(d):
    """Issue 39, finding 6: a login grant is revocable from the console too.
    While port 8000 is shared with signed-in users a token link for it is
    refused (409); once the console stops sharing it, the grant is gone."""
    box = f"/api/v2/sandboxes/boxes/{RENAMED}"
    form = d.find_element(By.CSS_SELECTOR, "form[aria-label='Service URL']")
    port = form.find_element(By.NAME, "port")
    clear_field(port)
    port.send_keys("8000")
    Select(form.find_element(By.NAME, "access")).select_by_value("workspace")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(d, lambda d: d.find_elements(By.PARTIAL_LINK_TEXT, "port 8000 (signed-in"), 20, "the login link")
    status, body = api("POST", f"{box}/service-url", body={"port": 8000})
    assert status == 409, f"a token link beside a login grant: {status} {body}"

    form = d.find_element(By.CSS_SELECTOR, "form[aria-label='Stop sharing']")
    form.find_element(By.NAME, "port").send_keys("8000")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(d, EC.alert_is_present(), 5, "the confirmation").accept()
    wait(d, lambda d: "no longer shared" in (text_of(d, ".unshared") or ""), 20, "the notice")
    assert not d.find_elements(By.PARTIAL_LINK_TEXT, "port 8000 (signed-in")
    status, body = api("POST", f"{box}/service-url", body={"port": 8000})
    assert status == 200, f"the grant outlived its revocation: {status} {body}"


def test_stop_start_then_delete(d):
    d.find_element(By.XPATH, "//button[normalize-space()='Stop']").click()
    status = lambda d: text_of(d, ".heading .status")
    wait(d, lambda d: status(d) == "stopped", 120, "stopped")
    assert d.find_elements(By.CSS_SELECTOR, ".terminal") == [], "a terminal into a stopped sandbox"
    d.find_element(By.XPATH, "//button[normalize-space()='Start']").click()
    wait(d, lambda d: status(d) == "ready", BOOT, "ready again")
    wait(d, lambda d: text_of(d, ".term-state") == "connected", 60,
         "a new terminal")
    # Its status history shows its life, oldest first: created, the stop
    # and the start.
    def passes(d):
        rows = d.execute_script(
            "return [...document.querySelectorAll('table.history tbody tr')]"
            ".map((r) => r.dataset.status)")
        return [s for i, s in enumerate(rows) if i == 0 or rows[i - 1] != s]
    wait(d, lambda d: passes(d)[-3:] == ["stopped", "provisioning", "ready"], 20,
         "the stop and the start in the history")
    assert passes(d)[:2] == ["provisioning", "ready"], passes(d)
    d.execute_script("document.querySelector('table.history').scrollIntoView()")
    shot(d, "history")
    axe(d, "sandbox-history")
    d.find_element(By.XPATH, "//button[normalize-space()='Delete']").click()
    wait(d, EC.alert_is_present(), 5, "the confirmation").accept()
    wait(d, EC.presence_of_element_located((By.ID, "sandboxes-title")), 30, "back to the list")
    wait(d, lambda d: api("GET", f"/api/v2/sandboxes/boxes/{RENAMED}")[0] == 404, 120, "deleted")


def test_snapshots_and_secrets_pages(d):
    d.find_element(By.LINK_TEXT, "Snapshots").click()
    wait(d, lambda d: SNAPSHOT in (text_of(d, "main") or ""), 20, "the snapshot list")
    shot(d, "snapshots")
    axe(d, "snapshots")
    # The captured snapshot, deleted from its page.
    d.find_element(By.XPATH, f"//tr[td[normalize-space()='{SNAPSHOT}']]//button[normalize-space()='Delete']").click()
    wait(d, EC.alert_is_present(), 5, "the confirmation").accept()
    wait(d, lambda d: SNAPSHOT not in (text_of(d, "tbody") or ""), 60, "the snapshot deleted")
    d.find_element(By.LINK_TEXT, "Secrets").click()
    form = wait(d, EC.presence_of_element_located((By.CSS_SELECTOR, "form[aria-label='Set a secret']")),
                what="the secrets page")
    form.find_element(By.NAME, "key").send_keys("CONSOLE_TOKEN")
    form.find_element(By.NAME, "value").send_keys("s3cret-value")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(d, lambda d: "CONSOLE_TOKEN" in (text_of(d, "main") or ""), 20, "the secret")
    assert "s3cret-value" not in d.page_source
    shot(d, "secrets")
    axe(d, "secrets")
    d.find_element(By.XPATH, "//button[@aria-label='Delete secret CONSOLE_TOKEN']").click()
    wait(d, lambda d: "CONSOLE_TOKEN" not in (text_of(d, "main") or ""), 20,
         "the secret deleted")


def test_templates_page_shows_builds_and_a_failing_builds_log(d):
    """A template built through E2B's template API (as its SDK calls it),
    and a build of it that fails: the Templates page lists it, its page
    its builds, and a build's log names the failing step and its output."""
    name = "console-tpl"
    builds = []
    for steps in ([{"type": "RUN", "args": ["echo console-built > /tmp/built"]}],
                  [{"type": "RUN", "args": ["echo console-about-to-fail && exit 4"]}]):
        status, b = api("POST", "/v3/templates", body={"name": name})
        assert status == 202, (status, b)
        status, _ = api("POST", f"/v2/templates/{name}/builds/{b['buildID']}",
                        body={"fromTemplate": IMAGE, "steps": steps})
        assert status == 202, status
        for _ in range(BOOT):
            status, v = api("GET", f"/templates/{name}/builds/{b['buildID']}/status")
            if v["status"] in ("ready", "error"):
                break
            time.sleep(1)
        builds.append((b["buildID"], v["status"]))
    assert [s for _, s in builds] == ["ready", "error"], builds
    failed = builds[1][0]
    d.find_element(By.LINK_TEXT, "Templates").click()
    wait(d, lambda d: text_of(d, f"tr[data-template='{name}']") is not None, 20, "the template list")
    shot(d, "templates")
    axe(d, "templates")
    d.find_element(By.LINK_TEXT, name).click()
    wait(d, lambda d: text_of(d, f"tr[data-build='{failed}']") is not None, 20, "its builds")
    d.find_element(By.XPATH, f"//button[@aria-label='Log of build {failed}']").click()
    wait(d, lambda d: "console-about-to-fail" in (text_of(d, ".build-log") or ""), 30, "the failed build's log")
    assert "step 1" in (text_of(d, ".notice") or ""), text_of(d, ".notice")
    shot(d, "template")
    axe(d, "template")
    d.find_element(By.LINK_TEXT, "All templates").click()
    # The build warms its host's copy of the template's memory with a
    # sandbox of it, made and deleted in the background; a delete while
    # that sandbox lives is refused (the page says so), and is tried again.
    for attempt in range(12):
        wait(d, EC.element_to_be_clickable(
            (By.XPATH, f"//button[@aria-label='Delete template {name}']")), 20, "the list").click()
        wait(d, EC.alert_is_present(), 5, "the confirmation").accept()
        try:
            wait(d, lambda d: text_of(d, f"tr[data-template='{name}']") is None, 10, "the template gone")
            break
        except Exception:
            if attempt == 11:
                raise


def test_keys_page_creates_a_key_that_works_then_revokes_it(d):
    d.find_element(By.LINK_TEXT, "API keys").click()
    form = wait(d, EC.presence_of_element_located((By.CSS_SELECTOR, "form[aria-label='New API key']")),
                what="the keys page")
    form.find_element(By.NAME, "description").send_keys("made in the console")
    form.find_element(By.CSS_SELECTOR, "input[value='sandboxes:read']").click()
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    secret = wait(d, lambda d: text_of(d, ".new-key .secret"), 20, "the new key's secret")
    status, _ = api("GET", "/api/v2/sandboxes/boxes", key=secret)
    assert status == 200, status
    status, _ = api("POST", "/api/v2/sandboxes/boxes", key=secret, body={"name": "console-nope"})
    assert status == 403, f"a read-only key created a sandbox: {status}"
    shot(d, "keys")
    axe(d, "keys")
    row = wait(d, lambda d: d.find_elements(By.XPATH, "//tr[td[normalize-space()='made in the console']]"),
               20, "the key listed")[0]
    row.find_element(By.XPATH, ".//button[normalize-space()='Revoke']").click()
    wait(d, EC.alert_is_present(), 5, "the confirmation").accept()
    wait(d, lambda d: "made in the console" not in (text_of(d, "tbody") or ""), 20, "the key gone")
    status, _ = api("GET", "/api/v2/sandboxes/boxes", key=secret)
    assert status == 401, f"a revoked key still works: {status}"


def test_pools_page_creates_fills_and_deletes_a_pool(d):
    d.find_element(By.LINK_TEXT, "Pools").click()
    form = wait(d, EC.presence_of_element_located((By.CSS_SELECTOR, "form[aria-label='New pool']")),
                what="the pools page")
    form.find_element(By.NAME, "name").send_keys("console-pool")
    form.find_element(By.NAME, "snapshot").send_keys(IMAGE)
    form.find_element(By.NAME, "size").send_keys("1")
    form.find_element(By.NAME, "mem").send_keys("2")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait(d, lambda d: text_of(d, "tr[data-pool='console-pool'] .pool-ready") == "1", BOOT,
         "the pool's member ready")
    shot(d, "pools")
    axe(d, "pools")
    d.find_element(By.XPATH, "//button[@aria-label='Delete pool console-pool']").click()
    wait(d, EC.alert_is_present(), 5, "the confirmation").accept()
    wait(d, lambda d: text_of(d, "tr[data-pool='console-pool']") is None, 60, "the pool gone")


def test_an_operator_sees_the_hosts(d):
    hearth = [os.environ["HEARTH_BIN"]]
    env = dict(os.environ, HEARTH_DATA_DIR=os.environ["HEARTH_DATA_DIR"])
    made = subprocess.run(hearth + ["keys", "create", "--permission", "fleet:read",
                                    "--description", "console-operator"],
                          env=env, capture_output=True, text=True, check=True)
    # A workspace's key (*, not fleet:read) is refused the hosts page,
    # with the reason.
    d.find_element(By.XPATH, "//button[normalize-space()='Sign out']").click()
    sign_in(d, OTHER_KEY)
    wait(d, EC.presence_of_element_located((By.ID, "sandboxes-title")), what="signed in")
    d.find_element(By.LINK_TEXT, "Hosts").click()
    alert = wait(d, lambda d: text_of(d, ".alert"), 20, "the refusal")
    assert "fleet:read" in alert, alert
    d.find_element(By.XPATH, "//button[normalize-space()='Sign out']").click()
    sign_in(d, made.stdout.strip())
    wait(d, EC.presence_of_element_located((By.ID, "sandboxes-title")), what="signed in")
    d.find_element(By.LINK_TEXT, "Hosts").click()
    wait(d, lambda d: "live" in (text_of(d, "tbody") or ""), 20, "a host with a live lease")
    assert text_of(d, "tbody .status") == "ready", text_of(d, "tbody")
    assert text_of(d, "tbody .host-disk") not in (None, "0 B"), text_of(d, "tbody")
    shot(d, "hosts")
    axe(d, "hosts")
    d.find_element(By.XPATH, "//button[normalize-space()='Sign out']").click()
    sign_in(d, KEY)
    wait(d, EC.presence_of_element_located((By.ID, "sandboxes-title")), what="signed in again")


def test_another_workspace_sees_none_of_the_first(d):
    s, body = api("POST", "/api/v2/sandboxes/boxes",
                  body={"name": "console-private", "snapshot_name": IMAGE, "mem_bytes": 2 << 30,
                        "wait_for_ready": False})
    assert s == 201, (s, body)
    try:
        d.find_element(By.XPATH, "//button[normalize-space()='Sign out']").click()
        sign_in(d, OTHER_KEY)
        wait(d, EC.presence_of_element_located((By.ID, "sandboxes-title")), what="the list")
        wait(d, lambda d: "No sandboxes yet" in (text_of(d, "main") or ""), 20,
             "an empty list")
        assert "console-private" not in d.page_source
        d.get(URL + "/console/#/sandboxes/console-private")
        alert = wait(d, lambda d: text_of(d, ".alert"), 20, "a refusal")
        assert "not found" in alert.lower(), alert
        assert text_of(d, ".actions") is None, "another workspace's sandbox has actions"
    finally:
        api("DELETE", "/api/v2/sandboxes/boxes/console-private")


def test_a_revoked_key_is_signed_out(d):
    hearth = [os.environ["HEARTH_BIN"]]
    env = dict(os.environ, HEARTH_DATA_DIR=os.environ["HEARTH_DATA_DIR"])
    made = subprocess.run(hearth + ["keys", "create", "--description", "console-revoke"],
                          env=env, capture_output=True, text=True, check=True)
    secret = made.stdout.strip()
    key_id = re.search(r"key (\S+) in workspace", made.stderr).group(1)
    d.find_element(By.XPATH, "//button[normalize-space()='Sign out']").click()
    sign_in(d, secret)
    wait(d, EC.presence_of_element_located((By.ID, "sandboxes-title")), what="signed in")
    subprocess.run(hearth + ["keys", "revoke", key_id], env=env, check=True, capture_output=True)
    notice = wait(d, EC.presence_of_element_located((By.CSS_SELECTOR, ".signin .notice")), 20,
                  "the sign-out")
    assert "revoked" in notice.text, notice.text
    assert d.execute_script("return sessionStorage.getItem('hearth.apiKey')") is None
    shot(d, "signed-out")


def execute(key, box, command):
    """Runs `command` in sandbox `box` (its id) through the data plane."""
    status, out = api("POST", f"/dataplane/{box}/execute", key=key, body={"command": command, "timeout": 60})
    assert status == 200 and out.get("exit_code") == 0, (status, out)


EVIL_PAGE = """<!doctype html><title>waiting</title><script>
fetch(%(victim)s, {credentials: "include"})
  .then(r => r.text()).then(t => { document.title = "READ:" + t; }, e => { document.title = "BLOCKED"; });
</script>"""

CSRF_PAGE = """<!doctype html><form method="post" action=%(action)s>
<input name="api_key" value=%(key)s><input name="next" value="/"><input name="csrf" value="x"></form>
<script>document.forms[0].submit();</script>"""


def test_a_token_url_page_cannot_read_another_tenants_login_service(d):
    """Issue 39, finding 2: every sandbox port is its own origin. A user
    signed in to workspace B's restricted service opens workspace A's
    token URL, whose page tries to read B's service with the user's
    cookies: the browser's same-origin rule refuses. A cross-site sign-in
    form posted at B's service is refused by Hearth."""
    made = {}
    for key, name in ((OTHER_KEY, "console-b"), (KEY, "console-a")):
        s, body = api("POST", "/api/v2/sandboxes/boxes", key=key,
                      body={"name": name, "snapshot_name": IMAGE, "mem_bytes": 2 << 30,
                            "wait_for_ready": True, "timeout": BOOT})
        assert s == 201, (s, body)
        made[name] = (key, body["id"])
    try:
        b_key, b_id = made["console-b"]
        execute(b_key, b_id, "mkdir -p /srv && echo secret-of-b > /srv/index.html && busybox httpd -p 8000 -h /srv")
        s, grant = api("POST", "/api/v2/sandboxes/boxes/console-b/service-url", key=b_key,
                       body={"port": 8000, "access": "restricted"})
        assert s == 200, (s, grant)
        victim = grant["browser_url"]
        assert "://8000-" in victim and "/services/" not in victim, victim
        # The user signs in to B's service on its own origin.
        d.get(victim)
        field = wait(d, EC.presence_of_element_located((By.NAME, "api_key")), 60, "B's sign-in form")
        field.send_keys(OTHER_KEY)
        d.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait(d, lambda d: "secret-of-b" in d.page_source, 60, "B's service after signing in")
        # A's token URL serves a page that reads B's service (and the old
        # login path on the API's origin) with the user's cookies.
        a_key, a_id = made["console-a"]
        victims = [victim, f"{URL}/services/login/{b_id}/8000/"]
        for i, v in enumerate(victims):
            page = EVIL_PAGE % {"victim": json.dumps(v)}
            execute(a_key, a_id, f"mkdir -p /srv && cat > /srv/evil{i}.html <<'EOF'\n{page}\nEOF")
        execute(a_key, a_id, "busybox httpd -p 8000 -h /srv")
        s, token_url = api("POST", "/api/v2/sandboxes/boxes/console-a/service-url", key=a_key,
                           body={"port": 8000})
        assert s == 200, (s, token_url)
        for i, v in enumerate(victims):
            d.get(token_url["browser_url"] + f"&next=/evil{i}.html")
            title = wait(d, lambda d: d.title if d.title != "waiting" else None, 30, f"the page's read of {v}")
            assert title == "BLOCKED" and "secret-of-b" not in d.page_source, (v, title)
        # A cross-site sign-in form (login CSRF) posted at B's service.
        signin = victim.rstrip("/") + "/.hearth/signin"
        csrf = CSRF_PAGE % {"action": json.dumps(signin), "key": json.dumps(KEY)}
        execute(a_key, a_id, f"cat > /srv/csrf.html <<'EOF'\n{csrf}\nEOF")
        d.get(token_url["browser_url"] + "&next=/csrf.html")
        wait(d, lambda d: "sign-in refused" in d.page_source, 30, "the cross-site sign-in refused")
        assert "Origin" in d.page_source, d.page_source[:300]
        shot(d, "cross-site-sign-in-refused")
    finally:
        for name, (key, _) in made.items():
            api("DELETE", f"/api/v2/sandboxes/boxes/{name}", key=key)


TESTS = [
    test_sign_in_refuses_a_wrong_key_then_accepts_the_right_one,
    test_create_a_sandbox_and_watch_it_become_ready,
    test_terminal_runs_commands_resizes_and_survives_a_dropped_connection,
    test_upload_then_download_is_byte_identical,
    test_rename_and_capture_a_snapshot,
    test_share_a_port_with_signed_in_users_then_stop_sharing,
    test_stop_start_then_delete,
    test_snapshots_and_secrets_pages,
    test_templates_page_shows_builds_and_a_failing_builds_log,
    test_keys_page_creates_a_key_that_works_then_revokes_it,
    test_pools_page_creates_fills_and_deletes_a_pool,
    test_an_operator_sees_the_hosts,
    test_another_workspace_sees_none_of_the_first,
    test_a_revoked_key_is_signed_out,
    test_a_token_url_page_cannot_read_another_tenants_login_service,
]


def main():
    d = browser()
    failed = 0
    try:
        for t in TESTS:
            started = time.monotonic()
            try:
                t(d)
                print(f"PASS {t.__name__} ({time.monotonic() - started:.1f}s)", flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {t.__name__} ({time.monotonic() - started:.1f}s)", flush=True)
                traceback.print_exc()
                shot(d, f"failed-{t.__name__}")
                for entry in d.get_log("browser")[-20:]:
                    print("  browser:", entry.get("message"), flush=True)
                break  # the tests build on each other
    finally:
        d.quit()
        status, body = api("GET", "/api/v2/sandboxes/boxes")
        for b in (body or {}).get("items", []):
            if b["name"].startswith("console-"):
                api("DELETE", f"/api/v2/sandboxes/boxes/{b['name']}")
    print(f"screenshots in {SHOTS}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
