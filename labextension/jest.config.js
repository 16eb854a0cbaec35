// The model and the formatting are plain TypeScript (no JupyterLab import), so they are
// tested with ts-jest in node, without JupyterLab's jsdom/babel preset.
module.exports = {
  testEnvironment: 'node',
  roots: ['<rootDir>/src'],
  testRegex: 'src/__tests__/.*\\.spec\\.ts$',
  transform: {
    '^.+\\.ts$': ['ts-jest', { tsconfig: { module: 'commonjs', types: ['jest'], strict: true, esModuleInterop: true, target: 'ES2020', lib: ['ES2020', 'DOM'] } }]
  }
};
