"""Opens a node's status page in headless Chromium and reports what it shows.

Usage: status_page.py URL SCREENSHOT_PATH [USER PASSWORD]
Waits (up to 30 s) for at least one table row and one lag-chart line, then (up to 15 s)
for the page to update itself, and prints one JSON line: the table names, the number of
lag-chart polylines, whether `#updated` changed, and the browser console's SEVERE and
WARNING messages. Saves a 1280x1000 screenshot. Exits 0, or 1 (with "error" and the page
source's length in the JSON) on a timeout or failure.
"""

import json
import sys
import urllib.parse

from selenium import webdriver
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait


def with_credentials(url: str, user: str, password: str) -> str:
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    auth = urllib.parse.quote(user, safe="") + ":" + urllib.parse.quote(password, safe="")
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{auth}@{host}"))


def console_messages(driver) -> list:
    try:
        return [
            entry.get("message", "")
            for entry in driver.get_log("browser")
            if entry.get("level") in ("SEVERE", "WARNING")
        ]
    except WebDriverException as e:
        return [f"could not read the browser log: {e.msg}"]


def main() -> int:
    if len(sys.argv) not in (3, 5):
        print(__doc__, file=sys.stderr)
        return 2
    url, screenshot = sys.argv[1], sys.argv[2]
    if len(sys.argv) == 5:
        url = with_credentials(url, sys.argv[3], sys.argv[4])

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})

    report = {"tables": [], "polylines": 0, "updated_changed": False, "console": []}
    driver = None
    code = 0
    try:
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        driver.set_window_size(1280, 1000)
        driver.get(url)
        WebDriverWait(driver, 30).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, "#tables tr.table-row")
            and d.find_elements(By.CSS_SELECTOR, "#lag-chart polyline"),
            "no #tables tr.table-row and #lag-chart polyline after 30 s",
        )
        before = driver.find_element(By.ID, "updated").text
        try:
            WebDriverWait(driver, 15).until(
                lambda d: d.find_element(By.ID, "updated").text != before
            )
            report["updated_changed"] = True
        except TimeoutException:
            report["updated_changed"] = False
    except Exception as e:  # report what was seen, whatever went wrong
        code = 1
        kind = "timeout" if isinstance(e, TimeoutException) else type(e).__name__
        report["error"] = f"{kind}: {getattr(e, 'msg', None) or e}".strip()
        report["page_source_length"] = len(driver.page_source) if driver else 0
    try:
        if driver is not None:
            report["tables"] = [
                row.find_element(By.CSS_SELECTOR, "td").text
                for row in driver.find_elements(By.CSS_SELECTOR, "#tables tr.table-row")
            ]
            report["polylines"] = len(driver.find_elements(By.CSS_SELECTOR, "#lag-chart polyline"))
            report["console"] = console_messages(driver)
            driver.save_screenshot(screenshot)
    except Exception as e:
        code = 1
        report.setdefault("error", f"{type(e).__name__}: {e}")
    finally:
        if driver is not None:
            driver.quit()
    print(json.dumps(report), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
