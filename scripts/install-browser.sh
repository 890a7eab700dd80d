#!/usr/bin/env bash
# Install (when missing) Debian's Chromium for the report tests: `hpcdl report`'s HTML
# is opened in a real headless browser (tests/browser.py, through Playwright's Python
# client with executable_path=/usr/bin/chromium). No browser is downloaded by
# Playwright itself (`playwright install` is never run): the Debian package is the browser.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/install-debs.sh" browser chromium fonts-dejavu-core
