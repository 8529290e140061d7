// The build's first step: the standalone schemas the client reads, from the repository's
// contract (schemas/avro/standalone/) into dist/schemas, so the package carries them.
const fs = require("node:fs");
const path = require("node:path");

const source = path.join(__dirname, "..", "..", "..", "schemas", "avro", "standalone");
const target = path.join(__dirname, "..", "dist", "schemas");
fs.mkdirSync(target, { recursive: true });
for (const name of ["UsageEvent", "Verdict", "BudgetPolicy", "BudgetRaise", "GenerationSwitch", "PriceTable"]) {
  fs.copyFileSync(path.join(source, `${name}.avsc`), path.join(target, `${name}.avsc`));
}
