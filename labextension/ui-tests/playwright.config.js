/**
 * Galata (JupyterLab's Playwright helpers) on Debian's Chromium: never a downloaded
 * browser. tests/ui/run_galata.py starts the jupyter server and the gateway and sets
 * TARGET_URL; `make uitest` runs it.
 */
const path = require('path');
const baseConfig = require('@jupyterlab/galata/lib/playwright-config');

const artifacts = process.env.GPUAAS_ARTIFACTS || path.resolve(__dirname, '../../test-artifacts/ui');

module.exports = {
  ...baseConfig,
  testDir: './tests',
  // One server, one gateway, one user: the tests share them and run in order.
  workers: 1,
  fullyParallel: false,
  retries: 0,
  timeout: 150 * 1000,
  expect: { timeout: 20 * 1000 },
  outputDir: path.join(artifacts, 'results'),
  reporter: [['list']],
  use: {
    ...baseConfig.use,
    baseURL: process.env.TARGET_URL || 'http://127.0.0.1:8888',
    viewport: { width: 1280, height: 860 },
    trace: 'off',
    video: 'off',
    screenshot: 'only-on-failure',
    launchOptions: {
      executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
      args: [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--no-first-run'
      ]
    }
  }
};
