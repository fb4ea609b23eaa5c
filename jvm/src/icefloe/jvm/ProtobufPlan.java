package icefloe.jvm;

import java.util.HashMap;
import java.util.Map;

/**
 * A table's Protobuf message type as {@link ProtobufRows} decodes it: the plan text that
 * icefloe.formats.protobuf.jvm writes, parsed. Tokens are separated by spaces:
 *
 * <pre>
 * plan    := frameHex message
 * message := "message" fieldCount field* oneofCount oneofName*
 * field   := number name shape presence oneofIndex type [type]   (shape "map": key type, then value type)
 * type    := kind | "enum" closed count (number name)* | "message" message | "wrapper" kind
 * </pre>
 *
 * A message's row holds its fields in plan order, then one column per oneof (the name of the member set).
 */
final class ProtobufPlan {
  static final int DOUBLE = 0, FLOAT = 1, INT32 = 2, INT64 = 3, UINT32 = 4, UINT64 = 5, SINT32 = 6,
      SINT64 = 7, FIXED32 = 8, FIXED64 = 9, SFIXED32 = 10, SFIXED64 = 11, BOOL = 12, STRING = 13,
      BYTES = 14, ENUM = 15, MESSAGE = 16, TIMESTAMP = 17, DURATION = 18, WRAPPER = 19;
  static final int SINGLE = 0, REPEATED = 1, MAP = 2;
  private static final String[] KINDS = {
    "double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32", "fixed64",
    "sfixed32", "sfixed64", "bool", "string", "bytes", "enum", "message", "timestamp", "duration", "wrapper"
  };
  private static final String[] SHAPES = {"single", "repeated", "map"};

  static final class Type {
    final int kind;
    Message message; // MESSAGE
    Map<Integer, String> enumNames; // ENUM: number -> name
    boolean closed; // ENUM: a number it does not name is no value (proto2), not its digits
    Type wrapped; // WRAPPER: the scalar in field 1

    Type(int kind) {
      this.kind = kind;
    }

    /** The Protobuf wire type of one value of this type. */
    int wireType() {
      switch (kind) {
        case DOUBLE: case FIXED64: case SFIXED64:
          return 1;
        case FLOAT: case FIXED32: case SFIXED32:
          return 5;
        case STRING: case BYTES: case MESSAGE: case TIMESTAMP: case DURATION: case WRAPPER:
          return 2;
        default:
          return 0;
      }
    }
  }

  static final class Field {
    int number;
    String name;
    int shape;
    boolean presence; // null when not sent (otherwise the type's default)
    int oneof; // index of its oneof, -1 for none
    Type type; // the value's type (a map's value)
    Type key; // MAP: the key's type
  }

  static final class Message {
    Field[] fields;
    String[] oneofs;
    final Map<Integer, Integer> positions = new HashMap<>(); // field number -> index in fields

    int columns() {
      return fields.length + oneofs.length;
    }
  }

  final byte[] frame; // the bytes every record of the table starts with: magic byte, schema id, message indexes
  final Message root;

  private final String[] tokens;
  private int next;

  ProtobufPlan(String text) {
    tokens = text.trim().split(" +");
    String hex = take();
    frame = new byte[hex.length() / 2];
    for (int i = 0; i < frame.length; i++) {
      frame[i] = (byte) Integer.parseInt(hex.substring(2 * i, 2 * i + 2), 16);
    }
    root = message();
    if (next != tokens.length) {
      throw new IllegalArgumentException("plan has tokens after its message: " + tokens[next]);
    }
  }

  private String take() {
    if (next >= tokens.length) {
      throw new IllegalArgumentException("plan ends early");
    }
    return tokens[next++];
  }

  private int number() {
    return Integer.parseInt(take());
  }

  private Message message() {
    expect("message");
    Message message = new Message();
    message.fields = new Field[number()];
    for (int i = 0; i < message.fields.length; i++) {
      Field field = new Field();
      field.number = number();
      field.name = take();
      field.shape = indexOf(SHAPES, take());
      field.presence = number() == 1;
      field.oneof = number();
      if (field.shape == MAP) {
        field.key = type();
      }
      field.type = type();
      message.fields[i] = field;
      message.positions.put(field.number, i);
    }
    message.oneofs = new String[number()];
    for (int i = 0; i < message.oneofs.length; i++) {
      message.oneofs[i] = take();
    }
    return message;
  }

  private Type type() {
    Type type = new Type(indexOf(KINDS, take()));
    if (type.kind == ENUM) {
      type.closed = number() == 1;
      int count = number();
      type.enumNames = new HashMap<>();
      for (int i = 0; i < count; i++) {
        type.enumNames.put(number(), take());
      }
    } else if (type.kind == MESSAGE) {
      next--; // the message reads its own keyword
      type.message = message();
    } else if (type.kind == WRAPPER) {
      type.wrapped = new Type(indexOf(KINDS, take()));
    }
    return type;
  }

  private void expect(String token) {
    String found = take();
    if (!found.equals(token)) {
      throw new IllegalArgumentException("plan has " + found + " where " + token + " belongs");
    }
  }

  private static int indexOf(String[] names, String name) {
    for (int i = 0; i < names.length; i++) {
      if (names[i].equals(name)) {
        return i;
      }
    }
    throw new IllegalArgumentException("plan names an unknown kind or shape: " + name);
  }
}
