"""Debian's Chromium, headless, driven by Selenium: what the explorer's browser tests, its
screenshots (scripts/explorer_screenshots.py) and its benchmark (bench/explorer.py) open pages in.

    from headless_chromium import chromium
    with chromium(downloads="/tmp/d") as browser:
        browser.get(url)
"""
import contextlib

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait


@contextlib.contextmanager
def chromium(downloads=None, width=1400, height=1000):
    """A headless Chromium whose console messages are kept (browser.get_log("browser")) and whose
    downloads land in `downloads`."""
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    if downloads:
        options.add_experimental_option("prefs", {"download.default_directory": downloads,
                                                  "download.prompt_for_download": False})
    browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        if downloads:
            browser.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": downloads})
        yield browser
    finally:
        browser.quit()


def wait_until_ready(browser, timeout=30):
    """Waits for the explorer page to have drawn what it draws on loading (body[data-ready])."""
    WebDriverWait(browser, timeout).until(lambda b: b.find_element("tag name", "body").get_attribute("data-ready"))
