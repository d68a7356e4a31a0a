"""A full-page screenshot of one page of the web UI in headless Chromium (Debian's chromium and
chromium-driver, through Selenium), served by waitress on the given database. For the issues' "Show"
items, e.g. a llama-server analysis' report after ``specroute llama-server analyze``:

    python benchmarks/screenshot_page.py --database sqlite:////tmp/x/specroute.db /llama-server/1 out.png
    python benchmarks/screenshot_page.py --database ... --element '#export' '/runs/2?export=vllm' out.png
    python benchmarks/screenshot_page.py --database ... --height 1100 /llama-server/1 docs/report_page.png
"""

from __future__ import annotations

import argparse
import threading
import time

import waitress
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from webui.app import create_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", required=True, help="the database URL the page reads")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument(
        "--element", help="a CSS selector: screenshot that element only (e.g. '#export'), else the whole page"
    )
    parser.add_argument(
        "--height",
        type=int,
        help="the window's height: screenshot the page's first screen only (default: all of it)",
    )
    parser.add_argument("path", help="the page, e.g. /llama-server/1")
    parser.add_argument("out", help="the PNG file to write")
    args = parser.parse_args()
    app = create_app({"database_url": args.database, "ui_worker": False})
    server = waitress.create_server(app, host="127.0.0.1", port=args.port)
    threading.Thread(target=server.run, daemon=True).start()
    time.sleep(0.5)
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={args.width},1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path="/usr/bin/chromedriver"), options=options)
    try:
        driver.get(f"http://127.0.0.1:{args.port}{args.path}")
        height = args.height or driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(args.width, height + (0 if args.height else 40))
        if args.element:
            driver.find_element("css selector", args.element).screenshot(args.out)
            print(f"wrote {args.out} ({args.element} of {args.path})")
        else:
            driver.save_screenshot(args.out)
            print(f"wrote {args.out} ({args.width}x{height})")
    finally:
        driver.quit()
        server.close()
        app.extensions["specroute.close"]()


if __name__ == "__main__":
    main()
