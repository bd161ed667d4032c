#!/usr/bin/env python3
"""The screenshots of docs/explorer.md, taken from a live `relgrad explore` in headless Chromium, so
that they show the page as it is.

    /usr/bin/python3 scripts/explorer_screenshots.py --relgrad build/relgrad \
        --runs runs/explorer/copy-none runs/explorer/copy-relative-k2 --prompt "5 9 ..." --out docs/explorer

Writes training.png (the runs and their curves), prompt.png (the two runs side by side on the
prompt, the mouse on one pair), position.png (the score's position part) and parameters.png.
"""
import argparse
import os
import subprocess
import sys
import time

from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from headless_chromium import chromium, wait_until_ready  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--relgrad", required=True, help="path to the relgrad program")
    parser.add_argument("--runs", nargs=2, required=True, help="two run directories, shown side by side")
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--layer", default="0")
    parser.add_argument("--head", default="0")
    parser.add_argument("--hover", nargs=2, type=int, default=[3, 2], metavar=("I", "J"), help="the pair hovered")
    parser.add_argument("--out", required=True, help="the folder for the PNG files")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    server = subprocess.Popen([args.relgrad, "explore", *args.runs, "--port", "0"], stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().split()[2]
        with chromium(width=1500, height=1100) as browser:
            browser.get(url)
            wait_until_ready(browser)

            def shot(element_id, name):
                element = browser.find_element(By.ID, element_id)
                browser.execute_script("arguments[0].scrollIntoView()", element)
                element.screenshot(os.path.join(args.out, name))
                print(os.path.join(args.out, name))

            shot("training-section", "training.png")
            Select(browser.find_element(By.ID, "run-b")).select_by_value("1")
            browser.find_element(By.ID, "prompt").send_keys(args.prompt)
            charts = lambda b: b.find_elements(By.CSS_SELECTOR, "#heatmaps figure")  # noqa: E731
            WebDriverWait(browser, 60).until(lambda b: len(charts(b)) == 2)
            Select(browser.find_element(By.ID, "layer")).select_by_value(args.layer)
            Select(browser.find_element(By.ID, "head")).select_by_value(args.head)
            i, j = args.hover
            cells = charts(browser)[1].find_elements(By.CSS_SELECTOR, "svg > g.cells > rect")
            length = int(round(len(cells) ** 0.5))
            browser.execute_script("arguments[0].scrollIntoView()", browser.find_element(By.ID, "prompt-section"))
            ActionChains(browser).move_to_element(cells[i * length + j]).perform()
            time.sleep(0.3)
            # the tooltip floats over the section: a screenshot of the window, where it shows
            browser.save_screenshot(os.path.join(args.out, "prompt.png"))
            print(os.path.join(args.out, "prompt.png"))
            ActionChains(browser).move_to_element(browser.find_element(By.TAG_NAME, "header")).perform()
            Select(browser.find_element(By.ID, "view")).select_by_value("position")
            shot("heatmaps", "position.png")
            shot("parameters-section", "parameters.png")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
