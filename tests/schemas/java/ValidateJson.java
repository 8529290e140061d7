// Validates JSON documents against a JSON Schema (draft 2020-12, formats asserted) with
// networknt's json-schema-validator, as a producer in Java would check what it sends.
// The schema file is the first argument; each line of stdin is one document, and each
// gets one line out:
//   ok
//   invalid TAB <the validator's messages, joined by " | ">
// Run by tests/schemas/test_usage_json_schema.py.
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.networknt.schema.JsonSchema;
import com.networknt.schema.JsonSchemaFactory;
import com.networknt.schema.SchemaValidatorsConfig;
import com.networknt.schema.SpecVersion;
import com.networknt.schema.ValidationMessage;
import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Set;
import java.util.TreeSet;

public class ValidateJson {
    public static void main(String[] args) throws Exception {
        ObjectMapper mapper = new ObjectMapper();
        JsonNode schemaNode = mapper.readTree(new File(args[0]));
        SchemaValidatorsConfig config =
                SchemaValidatorsConfig.builder().formatAssertionsEnabled(true).build();
        JsonSchema schema = JsonSchemaFactory.getInstance(SpecVersion.VersionFlag.V202012)
                .getSchema(schemaNode, config);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            Set<ValidationMessage> errors = schema.validate(mapper.readTree(line));
            if (errors.isEmpty()) {
                System.out.println("ok");
            } else {
                Set<String> messages = new TreeSet<>();
                for (ValidationMessage error : errors) {
                    messages.add(error.getMessage());
                }
                System.out.println("invalid\t" + String.join(" | ", messages).replace('\n', ' '));
            }
        }
    }
}
