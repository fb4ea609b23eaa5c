// Glue-framed Protobuf values made by the AWS library itself (software.amazon.glue:schema-registry-serde's
// GlueSchemaRegistryKafkaSerializer, dataFormat PROTOBUF), for tests/formats/test_glue_protobuf.py.
//
//   java -cp 'jvm/test-lib/glue-serde/*' GlueProtobufProducer.java <descriptor set> <topic> <NONE|ZLIB> [<key schema>]
//
// The descriptor set (a binary FileDescriptorSet, imports before importers, the schema's file last) gives the message
// types; stdin has one message per line, `<full name of its type> <base64 bytes>`, parsed as a DynamicMessage of
// that type; stdout gets one base64 Kafka value per line, as the serializer returned it. On the first value the serializer registers the file (as
// the .proto text it generates) under the schema named after the topic, its default naming, or finds the version
// already registered. Region, endpoint (a moto server) and registry come from GLUE_REGION, GLUE_ENDPOINT and
// GLUE_REGISTRY; credentials from the AWS SDK's default chain (the environment).
// With a fourth argument it writes Kafka keys: configured as a key serializer (isKey true) and with that schema name,
// as a Java producer must: the serde's default naming gives keys the topic's name too, the very schema of the values.
import com.amazonaws.services.schemaregistry.serializers.GlueSchemaRegistryKafkaSerializer;
import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.DescriptorProtos.FileDescriptorSet;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.FileDescriptor;
import com.google.protobuf.DynamicMessage;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

public class GlueProtobufProducer {
    public static void main(String[] args) throws Exception {
        FileDescriptor file = schemaFile(Path.of(args[0]));
        Map<String, Object> conf = new HashMap<>();
        conf.put("region", System.getenv("GLUE_REGION"));
        conf.put("endpoint", System.getenv("GLUE_ENDPOINT"));
        conf.put("registry.name", System.getenv("GLUE_REGISTRY"));
        conf.put("dataFormat", "PROTOBUF");
        conf.put("schemaAutoRegistrationEnabled", true);
        conf.put("compression", args[2]);
        boolean isKey = args.length > 3;
        if (isKey) {
            conf.put("schemaName", args[3]);
        }
        try (GlueSchemaRegistryKafkaSerializer serializer = new GlueSchemaRegistryKafkaSerializer()) {
            serializer.configure(conf, isKey);
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
            Base64.Decoder decoder = Base64.getDecoder();
            Base64.Encoder encoder = Base64.getEncoder();
            for (String line = in.readLine(); line != null; line = in.readLine()) {
                String[] typeAndBytes = line.trim().split(" ");
                DynamicMessage message = DynamicMessage.parseFrom(messageType(file, typeAndBytes[0]),
                        decoder.decode(typeAndBytes[1]));
                System.out.println(encoder.encodeToString(serializer.serialize(args[1], message)));
            }
        }
    }

    /** The set's last file, built with the Java runtime's own well-known types where it imports them. */
    static FileDescriptor schemaFile(Path descriptorSet) throws Exception {
        Map<String, FileDescriptor> built = new HashMap<>();
        for (FileDescriptor known : new FileDescriptor[] {
                com.google.protobuf.TimestampProto.getDescriptor(), com.google.protobuf.DurationProto.getDescriptor(),
                com.google.protobuf.WrappersProto.getDescriptor(), com.google.protobuf.StructProto.getDescriptor(),
                com.google.protobuf.AnyProto.getDescriptor(), com.google.protobuf.EmptyProto.getDescriptor()}) {
            built.put(known.getName(), known);
        }
        FileDescriptor last = null;
        for (FileDescriptorProto proto : FileDescriptorSet.parseFrom(Files.readAllBytes(descriptorSet)).getFileList()) {
            if (built.containsKey(proto.getName())) {
                last = built.get(proto.getName());
                continue;
            }
            List<FileDescriptor> dependencies = new ArrayList<>();
            for (String name : proto.getDependencyList()) {
                dependencies.add(built.get(name));
            }
            last = FileDescriptor.buildFrom(proto, dependencies.toArray(new FileDescriptor[0]));
            built.put(proto.getName(), last);
        }
        return last;
    }

    static Descriptor messageType(FileDescriptor file, String fullName) {
        Descriptor type = file.findMessageTypeByName(fullName.substring(fullName.lastIndexOf('.') + 1));
        if (type == null || !type.getFullName().equals(fullName)) {
            throw new IllegalArgumentException(fullName + " is not a top-level message of " + file.getName());
        }
        return type;
    }
}
